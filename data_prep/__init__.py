"""Raw text to a validated, tokenized, sharded dataset. Plain Python: no Flyte here."""
