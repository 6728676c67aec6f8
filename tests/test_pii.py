"""PII: each kind is found and redacted (or its document dropped, or left) per data.pii; the
prepare step counts redactions as pii_<kind>, drops as skipped_pii_<kind>, and dedups, hashes
and encodes the redacted text."""

import csv
import hashlib
import io

import pytest

from common.contracts import DOC_STATS
from data_prep.config import DataConfig, PiiConfig
from data_prep.filters import filtered_text
from data_prep.manifest import load_manifest
from data_prep.pii import scrub
from data_prep.prepare import prepare_dataset
from storage import open_store
from tests.helpers import english_docs, tiny_data, tiny_tokenizer, write_corpus

ALL = PiiConfig(email="redact", ip="redact", secret="redact")

FOUND = [
    ("Write to jane.doe+news@mail.example.co.uk today.", "Write to <EMAIL> today.", "pii_email"),
    ("Author: Guido <guido@python.org>", "Author: Guido <<EMAIL>>", "pii_email"),
    ("resolver 8.8.8.8 answers", "resolver <IP_ADDRESS> answers", "pii_ip"),
    ("dns 2001:4860:4860::8888 too", "dns <IP_ADDRESS> too", "pii_ip"),
    ("key = AKIAIOSFODNN7EXAMPLE", "key = <SECRET>", "pii_secret"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", "<SECRET>\n", "pii_secret"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----\nafter", "<SECRET>\nafter", "pii_secret"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789 end", "token <SECRET> end", "pii_secret"),
    ("slack xoxb-1234567890-abcdefghij end", "slack <SECRET> end", "pii_secret"),
    ("openai sk-proj-abcdefghijklmnopqrstuvwxyz0123456789 end", "openai <SECRET> end", "pii_secret"),
    # issue 32, item 6: a .netrc and a JWT read from a home folder went into the dataset as text
    ("machine api.example.com login alice password s3cr3t-pw\n", "<SECRET>\n", "pii_secret"),
    ("machine h\n  login bob\n  password hunter2 # netrc", "<SECRET> # netrc", "pii_secret"),
    # issue 50 finding 8: keywords in another order, an account, a Hugging Face token
    ("machine h password hunter2 login bob\n", "<SECRET>\n", "pii_secret"),
    ("machine h login bob account acct password hunter2 port 443 x", "<SECRET> x", "pii_secret"),
    ("default\n password pw login anonymous\n", "<SECRET>\n", "pii_secret"),
    ("export HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh\n", "export HF_TOKEN=<SECRET>\n", "pii_secret"),
    (
        "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ end",
        "Bearer <SECRET> end",
        "pii_secret",
    ),
]
KEPT = [
    "@property\ndef name(self): return self._name",
    "y = a@b.T  # a matrix product",
    "home router 192.168.1.1, loopback 127.0.0.1, docs 192.0.2.10",
    "version 1.2.3.4.5 and v10.2.3.4rc1",
    "every second item: x[1::2]",
    'password = "hunter2"  # a generic password is not matched',
    "the machine learning password field",
    "machine h login bob account acct  # no password: nothing to hide",
    "model = hf_hub_download(repo_id)",
    "eyJhbGciOiJIUzI1NiJ9 alone is not a token",
]


@pytest.mark.parametrize("text, redacted, kind", FOUND)
def test_each_kind_is_redacted(text, redacted, kind):
    assert scrub(text, ALL) == (redacted, "", {kind: 1})


@pytest.mark.parametrize("text", KEPT)
def test_look_alikes_are_left(text):
    assert scrub(text, ALL) == (text, "", {})


def test_modes():
    text = "mail a@example.org, key AKIAIOSFODNN7EXAMPLE, host 8.8.8.8"
    assert scrub(text, PiiConfig()) == ("mail <EMAIL>, key <SECRET>, host 8.8.8.8", "", {"pii_email": 1, "pii_secret": 1})
    assert scrub(text, PiiConfig(email="off", ip="off", secret="off")) == (text, "", {})
    assert scrub(text, PiiConfig(secret="drop"))[1:] == ("pii_secret", {})
    assert DataConfig(pii=PiiConfig(email="hide")).problems() == ["data.pii.email is 'hide': use one of redact, drop, off"]


def test_prepare_counts_redactions_and_drops_and_encodes_the_redacted_text(tmp_path):
    base = english_docs(22, seed=4)
    docs = {f"d{i}.txt": text for i, text in enumerate(base[:20])}
    # Alike but for the address: after redaction, exact duplicates.
    docs |= {"mail1.txt": base[20] + "\nWrite to ann@example.org.", "mail2.txt": base[20] + "\nWrite to bob@example.org."}
    docs |= {"key.txt": base[21] + "\n-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----"}
    corpus = str(write_corpus(tmp_path / "c", docs))
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(tiny_data(sources=[corpus]), tiny_tokenizer(), store)
    stats = load_manifest(store, ref)["stats"]
    assert (stats["pii_email"], stats["pii_secret"], stats["pii_ip"], stats["skipped_duplicate"]) == (1, 1, 0, 1)
    rows = {r["source"]: r for r in csv.DictReader(io.StringIO(store.get_bytes(f"{ref.prefix}/{DOC_STATS}").decode()))}
    redacted = base[21] + "\n<SECRET>"
    assert rows["key.txt"]["sha256"] == hashlib.sha256(redacted.encode()).hexdigest()
    assert filtered_text(docs["key.txt"], tiny_data())[0] == redacted

    drop = tiny_data(sources=[corpus], pii=PiiConfig(secret="drop"))
    manifest = load_manifest(store, prepare_dataset(drop, tiny_tokenizer(), store))
    assert manifest["stats"]["skipped_pii_secret"] == 1 and manifest["stats"]["pii_secret"] == 0
    assert manifest["sources"]["skipped_examples"]["pii_secret"] == ["key.txt"]
