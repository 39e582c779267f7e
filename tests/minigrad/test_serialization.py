"""Tests of minigrad.serialization: the safetensors format by hand, every dtype, atomic
writes, corrupt and crafted files (each check the reference reader makes), and nested trees."""

import json
import os
import struct

import numpy as np
import pytest

from minigrad import fileio
from minigrad.serialization import load_safetensors, load_tree, save_safetensors, save_tree

ALL_DTYPES = ["float32", "float64", "float16", "int64", "int32", "uint16", "uint8", "bool"]


def sample(rng, dtype, shape):
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 200, size=shape).astype(dtype)


def test_round_trip_every_dtype_and_shape(tmp_path, rng):
    arrays = {
        f"{dtype}_{i}": sample(rng, dtype, shape)
        for dtype in ALL_DTYPES
        for i, shape in enumerate([(3, 5), (), (0, 4), (2, 1, 3)])
    }
    path = tmp_path / "all.safetensors"
    save_safetensors(path, arrays, {"format": "np"})
    loaded, meta = load_safetensors(path)
    assert meta == {"format": "np"} and sorted(loaded) == sorted(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape, name
        np.testing.assert_array_equal(loaded[name], array, err_msg=name)
        assert loaded[name].flags.writeable


def test_non_contiguous_and_big_endian_inputs(tmp_path, rng):
    a = rng.standard_normal((3, 4))
    arrays = {"t": a.T, "be": a.astype(">f4"), "step": a[:, ::2]}
    save_safetensors(tmp_path / "x.safetensors", arrays)
    loaded, _ = load_safetensors(tmp_path / "x.safetensors")
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
    assert loaded["be"].dtype == np.float32


def test_file_layout_follows_the_format(tmp_path):
    path = tmp_path / "w.safetensors"
    save_safetensors(path, {"b": np.array([1, 2], np.uint8), "a": np.array([1.5], np.float64)})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0  # the header is padded so the data starts 8-aligned
    header = json.loads(raw[8 : 8 + n])
    assert header == {
        "a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]},
        "b": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]},
    }
    assert raw[8 + n :] == struct.pack("<d", 1.5) + bytes([1, 2])


def test_reads_a_file_written_by_hand(tmp_path):
    header = json.dumps(
        {
            "__metadata__": {"who": "hand"},
            "x": {"dtype": "I32", "shape": [2, 2], "data_offsets": [0, 16]},
        }
    ).encode()
    data = struct.pack("<4i", 1, -2, 3, 4)
    path = tmp_path / "hand.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    arrays, meta = load_safetensors(path)
    np.testing.assert_array_equal(arrays["x"], [[1, -2], [3, 4]])
    assert arrays["x"].dtype == np.int32 and meta == {"who": "hand"}


def test_bad_inputs_to_save(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match="'z' has dtype complex128"):
        save_safetensors(path, {"z": np.zeros(2, np.complex128)})
    with pytest.raises(TypeError, match="metadata must map str to str"):
        save_safetensors(path, {"a": np.zeros(2)}, {"step": 3})
    with pytest.raises(TypeError, match="'a' is a list, not an array"):
        save_safetensors(path, {"a": [1.0, 2.0]})
    assert not path.exists()


# ---- atomic writes ----------------------------------------------------------------------------
def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    save_safetensors(path, {"w": np.ones(3)})
    old = path.read_bytes()

    def crash(fd):  # the disk fails after the bytes were written, before the rename
        raise OSError("disk full")

    monkeypatch.setattr(fileio.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        save_safetensors(path, {"w": np.zeros(1000)})
    assert path.read_bytes() == old  # the old checkpoint survives whole
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # and no temporary file is left


# ---- corrupt files ----------------------------------------------------------------------------
@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.safetensors"
    save_safetensors(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3)})
    return path


def write_header(path, header, data=b""):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_truncated_files(good_file):
    raw = good_file.read_bytes()
    good_file.write_bytes(raw[:5])
    with pytest.raises(ValueError, match=r"good.safetensors is not a valid .* fewer than the 8"):
        load_safetensors(good_file)
    good_file.write_bytes(raw[:20])
    with pytest.raises(ValueError, match="the header claims .* bytes but the file has only 12"):
        load_safetensors(good_file)
    good_file.write_bytes(raw[:-4])  # the last float is cut off
    with pytest.raises(ValueError, match=r"need 24 data bytes but the file has 20 .*truncated"):
        load_safetensors(good_file)
    good_file.write_bytes(raw + b"\0" * 4)
    with pytest.raises(ValueError, match="4 bytes follow the last tensor's data"):
        load_safetensors(good_file)


def test_bad_headers(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(ValueError, match="bad.safetensors .* the header is not valid JSON"):
        load_safetensors(path)
    write_header(path, [1, 2])
    with pytest.raises(ValueError, match="not a JSON object"):
        load_safetensors(path)
    write_header(path, {"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8)
    with pytest.raises(ValueError, match="entry 'a' is malformed"):
        load_safetensors(path)
    write_header(path, {"a": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(ValueError, match="'a' has dtype 'F8_E4M3'; this reader knows"):
        load_safetensors(path)
    write_header(path, {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(ValueError, match=r"'a' has 8 bytes but shape \[3\] of F32 needs 12"):
        load_safetensors(path)
    write_header(path, {"__metadata__": {"step": 3}})
    with pytest.raises(ValueError, match="__metadata__ must map strings to strings"):
        load_safetensors(path)


def crafted(path, entries, n_data):
    """A file whose header lists ``entries`` (name -> (dtype, shape, [begin, end])) over
    ``n_data`` bytes of 1.0f (so a wrong reading is visible)."""
    header = {
        name: {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        for name, (dtype, shape, offsets) in entries.items()
    }
    write_header(path, header, np.ones(n_data // 4, np.float32).tobytes())
    return path


@pytest.mark.parametrize(
    "entries, n_data, message",
    [
        # two tensors on the same bytes: each would load, and alias the other
        (
            {"a": ("F32", [2], [0, 8]), "b": ("F32", [2], [4, 12])},
            12,
            r"'b' has data_offsets \[4, 12\] but the tensors before it end at 8: it overlaps",
        ),
        ({"a": ("F32", [2], [0, 8]), "b": ("F32", [2], [0, 8])}, 8, "overlaps"),
        # bytes nobody owns: before, between, after the tensors
        ({"a": ("F32", [1], [4, 8])}, 8, r"before it end at 0: it leaves a gap"),
        ({"a": ("F32", [1], [0, 4]), "b": ("F32", [1], [8, 12])}, 12, "leaves a gap"),
        ({"a": ("F32", [1], [0, 4])}, 8, "4 bytes follow the last tensor's data"),
        # misaligned: a tensor that starts in the middle of another's element
        ({"a": ("F32", [1], [0, 4]), "b": ("F32", [1], [2, 6])}, 8, "overlaps"),
        # the length does not match the shape, either way round
        ({"a": ("F32", [3], [0, 8])}, 8, r"'a' has 8 bytes but shape \[3\] of F32 needs 12"),
        ({"a": ("F64", [2, 2], [0, 16])}, 16, r"shape \[2, 2\] of F64 needs 32"),
        # offsets and shapes that are not counts
        ({"a": ("F32", [1], [8, 4])}, 8, "ends before it begins"),
        ({"a": ("F32", [1], [-4, 0])}, 8, "not two non-negative integers"),
        ({"a": ("F32", [1], [0, 4.0])}, 4, "not two non-negative integers"),
        ({"a": ("F32", [1], [0, 4, 8])}, 8, "not two non-negative integers"),
        ({"a": ("F32", [True], [0, 4])}, 4, "not a list of non-negative integers"),
        ({"a": ("F32", [-1, -1], [0, 4])}, 4, "not a list of non-negative integers"),
        ({"a": ("F32", "4", [0, 16])}, 16, "not a list of non-negative integers"),
        ({"a": ("F8_E4M3", [4], [0, 4])}, 4, "'a' has dtype 'F8_E4M3'; this reader knows"),
    ],
)
def test_crafted_offsets_and_shapes_are_refused(tmp_path, entries, n_data, message):
    path = crafted(tmp_path / "crafted.safetensors", entries, n_data)
    with pytest.raises(ValueError, match=f"crafted.safetensors is not a valid .*{message}"):
        load_safetensors(path)


def test_empty_tensors_share_an_offset(tmp_path):
    # zero-size tensors take no bytes, so several may start where the next one does
    entries = {"e1": ("F32", [0], [0, 0]), "e2": ("F32", [0, 3], [0, 0]), "a": ("F32", [1], [0, 4])}
    arrays, _ = load_safetensors(crafted(tmp_path / "e.safetensors", entries, 4))
    assert arrays["e2"].shape == (0, 3) and arrays["a"].tolist() == [1.0]


def test_duplicate_names_are_refused(tmp_path):
    # json.loads would keep the second silently; the reference reader refuses the file
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    path = tmp_path / "dup.safetensors"
    text = f'{{"a": {entry}, "a": {entry}}}'.encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(ValueError, match="dup.safetensors .* the header names 'a' twice"):
        load_safetensors(path)
    text = b'{"a": {"dtype": "F32", "dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}'
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(ValueError, match="names 'dtype' twice"):
        load_safetensors(path)


def test_a_huge_header_length_is_refused_before_reading_it(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(ValueError, match="the header claims 9223372036854775808 bytes, more than"):
        load_safetensors(path)


def test_a_header_nested_thousands_deep_is_refused_without_recursion(tmp_path):
    # json's own parser raises RecursionError near 1000; ours says what is wrong, at 101
    path = tmp_path / "deep.safetensors"
    for depth in (101, 5000):
        text = ('{"a": ' + "[" * depth + "]" * depth + "}").encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text)
        with pytest.raises(ValueError, match="deep.safetensors .* the header is nested more than"):
            load_safetensors(path)


# ---- trees ------------------------------------------------------------------------------------
def test_tree_round_trip(tmp_path, rng):
    tree = {
        "step": 7,
        "config": {"n_embd": 8, "bias": False, "name": "tiny", "dropout": None},
        "model": {"blocks.0.w": rng.standard_normal((2, 2)).astype(np.float32)},
        "optim": {"state": {0: {"step": 3, "exp_avg": np.ones(2)}}, "betas": (0.9, 0.95)},
        "losses": [np.float32(1.5), 2.0],
    }
    save_tree(tmp_path / "ckpt.safetensors", tree)
    loaded = load_tree(tmp_path / "ckpt.safetensors")
    assert loaded["step"] == 7 and loaded["config"] == tree["config"]
    np.testing.assert_array_equal(loaded["model"]["blocks.0.w"], tree["model"]["blocks.0.w"])
    assert loaded["optim"]["state"]["0"]["step"] == 3  # keys become strings, as in JSON
    assert loaded["optim"]["betas"] == [0.9, 0.95] and loaded["losses"] == [1.5, 2.0]
    _, meta = load_safetensors(tmp_path / "ckpt.safetensors")
    assert "minigrad.tree" in meta


def test_tree_errors(tmp_path):
    with pytest.raises(TypeError, match="a.b is a set, which is neither an array nor JSON"):
        save_tree(tmp_path / "t.safetensors", {"a": {"b": {1, 2}}})
    with pytest.raises(ValueError, match="two arrays would both be named 'a.b'"):
        save_tree(tmp_path / "t.safetensors", {"a.b": np.ones(1), "a": {"b": np.ones(1)}})
    save_safetensors(tmp_path / "plain.safetensors", {"a": np.ones(1)})
    with pytest.raises(ValueError, match="was not written by save_tree"):
        load_tree(tmp_path / "plain.safetensors")


def test_the_reference_library_reads_our_files(tmp_path, rng):
    st = pytest.importorskip(
        "safetensors.numpy", reason="the safetensors package is not installed (not a dependency)"
    )
    arrays = {dtype: sample(rng, dtype, (2, 3)) for dtype in ALL_DTYPES}
    save_safetensors(tmp_path / "x.safetensors", arrays, {"k": "v"})
    theirs = st.load_file(str(tmp_path / "x.safetensors"))
    for name, array in arrays.items():
        np.testing.assert_array_equal(theirs[name], array)
    st.save_file(arrays, str(tmp_path / "y.safetensors"))
    ours, _ = load_safetensors(tmp_path / "y.safetensors")
    for name, array in arrays.items():
        np.testing.assert_array_equal(ours[name], array)
