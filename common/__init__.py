"""What every package shares: user errors, field docs, hashing, configs from dicts, and the
stage contracts. A leaf: it imports nothing of ours outside ``common`` and nothing heavy
(no torch, no Flyte), so any library, task or command can use it."""
