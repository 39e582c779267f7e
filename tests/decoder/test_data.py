"""Data: the cached, checksummed download (against a local HTTP server) and token batches."""

import hashlib
import http.server
import socket
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from decoder.text import data
from decoder.text.data import (
    SHAKESPEARE_FILENAME,
    TokenDataset,
    cache_dir,
    load_shakespeare,
    load_text,
    token_dtype,
)
from decoder.text.tokenizer import CharTokenizer

BODY = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"
BODY_SHA256 = hashlib.sha256(BODY).hexdigest()


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch, tmp_path):
    """Each test gets its own empty cache folder and forgets what earlier ones checksummed."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(folder))
    monkeypatch.setattr(data, "_verified", set())
    return folder


@pytest.fixture
def server(monkeypatch):
    """A local HTTP server on a free port serving BODY at /input.txt and counting requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            if self.path != "/input.txt":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args):  # keep the test output quiet
            pass

    for var in ("no_proxy", "NO_PROXY"):  # a proxy from the environment must not intercept
        monkeypatch.setenv(var, "*")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield SimpleNamespace(url=f"{base}/input.txt", base=base, hits=hits)
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens, so a connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/input.txt"


# ---- files --------------------------------------------------------------------------------------
def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "mg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "mg"
    monkeypatch.delenv("MINIGRAD_DATA_DIR")
    assert cache_dir() == tmp_path / "xdg" / "minigrad"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "minigrad"


def test_load_text(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("naïve café\n", encoding="utf-8")
    assert load_text(path) == "naïve café\n"


def test_load_text_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        load_text(tmp_path / "missing.txt")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8.*byte 3"):
        load_text(latin1)


def test_load_shakespeare_from_a_given_path(tmp_path):
    path = tmp_path / "plays.txt"
    path.write_bytes(BODY)
    assert load_shakespeare(path) == BODY.decode()
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        load_shakespeare(tmp_path / "nowhere.txt")


def test_download_is_cached_atomically_and_fetched_once(server, fresh_cache):
    assert load_shakespeare(url=server.url, sha256=BODY_SHA256) == BODY.decode()
    assert [p.name for p in fresh_cache.iterdir()] == [SHAKESPEARE_FILENAME]  # no temp file
    assert (fresh_cache / SHAKESPEARE_FILENAME).read_bytes() == BODY
    assert load_shakespeare(url=server.url, sha256=BODY_SHA256) == BODY.decode()
    assert server.hits == ["/input.txt"]


def test_cached_file_is_checksummed_once_per_process(server, monkeypatch):
    load_shakespeare(url=server.url, sha256=BODY_SHA256)
    monkeypatch.setattr(data, "_verified", set())  # as if in a new process
    calls = []
    real = data.sha256_file
    monkeypatch.setattr(data, "sha256_file", lambda path: calls.append(path) or real(path))
    for _ in range(3):
        assert load_shakespeare(url=server.url, sha256=BODY_SHA256) == BODY.decode()
    assert len(calls) == 1
    assert len(server.hits) == 1  # the cached copy was good: no second download


def test_corrupt_cached_file_is_downloaded_again(server, fresh_cache):
    fresh_cache.mkdir()
    (fresh_cache / SHAKESPEARE_FILENAME).write_text("truncated")
    assert load_shakespeare(url=server.url, sha256=BODY_SHA256) == BODY.decode()
    assert len(server.hits) == 1


def test_checksum_mismatch_is_clear_and_leaves_nothing(server, fresh_cache):
    wrong = "0" * 64
    with pytest.raises(ValueError, match=f"expected sha256 {wrong}, got {BODY_SHA256}"):
        load_shakespeare(url=server.url, sha256=wrong)
    assert list(fresh_cache.iterdir()) == []


def test_unreachable_server_says_where_to_put_the_file(fresh_cache):
    with pytest.raises(RuntimeError, match="could not download") as info:
        load_shakespeare(url=closed_port_url(), sha256=BODY_SHA256)
    message = str(info.value)
    assert str(fresh_cache / SHAKESPEARE_FILENAME) in message
    assert "--data PATH" in message and BODY_SHA256 in message
    assert not fresh_cache.exists() or list(fresh_cache.iterdir()) == []


def test_http_error_is_reported_like_no_network(server):
    with pytest.raises(RuntimeError, match="404"):
        load_shakespeare(url=f"{server.base}/missing.txt", sha256=BODY_SHA256)


# ---- token batches ------------------------------------------------------------------------------
# 2000 distinct CJK characters in sorted order: each character's id is its position, so a
# window's ids tell where in the text it came from.
COUNTING = "".join(chr(0x4E00 + i) for i in range(2000))


@pytest.fixture
def counting(tmp_path) -> TokenDataset:
    return TokenDataset.from_text(COUNTING, CharTokenizer.from_text(COUNTING), tmp_path / "tok")


def test_split_is_90_10(counting):
    assert len(counting.train) == 1800 and len(counting.val) == 200
    assert counting.train.dtype == np.uint16
    np.testing.assert_array_equal(counting.val, np.arange(1800, 2000))


@pytest.mark.parametrize("split, lo, hi", [("train", 0, 1800), ("val", 1800, 2000)])
def test_batches_are_shifted_windows_inside_the_split(counting, rng, split, lo, hi):
    x, y = counting.get_batch(split, batch_size=64, block_size=16, rng=rng)
    assert x.shape == y.shape == (64, 16)
    assert x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])  # y is x shifted by one
    np.testing.assert_array_equal(x, x[:, :1] + np.arange(16))  # contiguous windows
    np.testing.assert_array_equal(y, x + 1)  # ... followed by the next token
    assert x.min() >= lo and y.max() < hi


def test_batches_cover_the_split_to_its_last_token(counting, rng):
    x, y = counting.get_batch("val", batch_size=2000, block_size=8, rng=rng)
    assert x.min() == 1800 and y.max() == 1999


def test_same_seed_same_batch(counting):
    a = counting.get_batch("train", 8, 32, np.random.default_rng(7))
    b = counting.get_batch("train", 8, 32, np.random.default_rng(7))
    c = counting.get_batch("train", 8, 32, np.random.default_rng(8))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_split_shorter_than_a_window_is_an_error(counting, rng):
    counting.get_batch("val", 4, block_size=199, rng=rng)  # 200 tokens: just enough
    with pytest.raises(ValueError, match="val split has 200 tokens.*block_size=200 needs 201"):
        counting.get_batch("val", 4, block_size=200, rng=rng)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        counting.get_batch("test", 4, block_size=8, rng=rng)


def test_token_cache_is_reused_without_tokenising(tmp_path, monkeypatch):
    tok = CharTokenizer.from_text(COUNTING)
    first = TokenDataset.from_text(COUNTING, tok, tmp_path)
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".npy"]  # no temp file

    def no_encode(text):
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr(tok, "encode", no_encode)
    second = TokenDataset.from_text(COUNTING, tok, tmp_path)
    assert second.path == first.path
    assert isinstance(second.train, np.memmap)  # read from disk as it is used
    np.testing.assert_array_equal(second.ids, first.ids)


def _damaged_cache(tmp_path, monkeypatch, damage):
    """Build the cache, ``damage(path)`` it, then load it again as a later run would."""
    tok = CharTokenizer.from_text(COUNTING)
    path = TokenDataset.from_text(COUNTING, tok, tmp_path).path
    damage(path)
    monkeypatch.setattr(data, "_verified", set())  # a later run: nothing checked yet
    return tok, path


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda p: np.save(p, np.load(p)[::-1].copy()), "truncated or overwritten"),  # other ids
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "truncated or overwritten"),
        (lambda p: p.with_suffix(".json").unlink(), "record .*json is missing"),
        (lambda p: p.with_suffix(".json").write_text("{"), "record .*json is unreadable"),
        (lambda p: p.unlink(), "the cache file is missing"),
    ],
    ids=["overwritten", "truncated", "no-record", "bad-record", "no-ids"],
)
def test_damaged_token_cache_is_rebuilt_with_a_warning(tmp_path, monkeypatch, damage, reason):
    tok, path = _damaged_cache(tmp_path, monkeypatch, damage)
    with pytest.warns(UserWarning, match=f"token cache .*{path.name}: .*{reason}.*rebuilding"):
        dataset = TokenDataset.from_text(COUNTING, tok, tmp_path)
    np.testing.assert_array_equal(dataset.ids, tok.encode(COUNTING))
    monkeypatch.setattr(data, "_verified", set())
    np.testing.assert_array_equal(TokenDataset.from_text(COUNTING, tok, tmp_path).ids, dataset.ids)


def test_damaged_token_cache_that_cannot_be_rewritten_is_a_clear_error(tmp_path, monkeypatch):
    tok, path = _damaged_cache(tmp_path, monkeypatch, lambda p: p.write_bytes(b"\x93NUMPY"))

    def read_only(path, text=False):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(data, "atomic_write", read_only)
    with pytest.warns(UserWarning, match="rebuilding"):
        with pytest.raises(
            OSError, match=f"could not write the token cache .*{path.name}.*MINIGRAD_DATA_DIR"
        ):
            TokenDataset.from_text(COUNTING, tok, tmp_path)


def test_token_cache_key_covers_text_and_tokenizer(tmp_path):
    tok = CharTokenizer.from_text(COUNTING)
    other_vocab = CharTokenizer.from_text(COUNTING + "!")
    paths = {
        TokenDataset.from_text(COUNTING, tok, tmp_path).path,
        TokenDataset.from_text(COUNTING[:-1], tok, tmp_path).path,
        TokenDataset.from_text(COUNTING, other_vocab, tmp_path).path,
    }
    assert len(paths) == 3


def test_large_vocabularies_are_stored_as_uint32(tmp_path):
    class Big:  # a stand-in for a tokenizer with more than 2**16 ids
        vocab_size = 70_000

        def encode(self, text):
            return [69_999 - i for i in range(len(text))]

        def to_dict(self):
            return {"type": "big"}

    dataset = TokenDataset.from_text("x" * 100, Big(), tmp_path)
    assert dataset.ids.dtype == np.uint32 and dataset.ids[0] == 69_999
    assert token_dtype(2**16).__name__ == "uint16"


def test_dataset_from_a_list_of_ids():
    dataset = TokenDataset([5, 3, 1] * 10)
    assert dataset.ids.dtype == np.uint16
    assert len(dataset.train) == 27 and len(dataset.val) == 3
    with pytest.raises(ValueError, match="empty"):
        TokenDataset.from_text("", CharTokenizer.from_text("a"))
    with pytest.raises(ValueError, match="val_fraction"):
        TokenDataset([1, 2, 3], val_fraction=1.0)
