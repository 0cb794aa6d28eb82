"""The one atomic writer: whole files or none, flushed to disk with their rename, readable as the umask allows."""

from __future__ import annotations

import json
import os

import pytest
import torch

from cagkit import files


@pytest.fixture
def fsynced(monkeypatch):
    """The (device, inode) of everything fsynced while the test runs."""
    seen = []
    real = os.fsync

    def record(fd):
        st = os.fstat(fd)
        seen.append((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return seen


def _id(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


@pytest.mark.parametrize("write", [
    lambda p: files.write_atomic(p, "ünïcode text\n"),
    lambda p: files.write_atomic(p, b"\x00bytes"),
    lambda p: files.write_json_atomic(p, {"a": [1, 2]}),
    lambda p: files.save_safetensors({"x": torch.arange(6).reshape(2, 3)}, p, metadata={"k": "v"}),
])
def test_every_kind_of_write_flushes_the_file_and_its_directory(write, tmp_path, fsynced):
    target = tmp_path / "out.bin"
    target.write_text("old")
    old = os.umask(0o022)
    try:
        write(target)
    finally:
        os.umask(old)
    assert _id(target) in fsynced and _id(tmp_path) in fsynced  # the data and the rename
    assert fsynced.index(_id(target)) < fsynced.index(_id(tmp_path))  # data first, then the directory entry
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert [f.name for f in tmp_path.iterdir()] == ["out.bin"]  # no temporary left
    assert target.read_bytes() != b"old"


def test_the_written_values_read_back(tmp_path):
    from safetensors.torch import load_file

    assert files.write_atomic(tmp_path / "t.txt", "Grüße").read_text(encoding="utf-8") == "Grüße"
    assert json.loads(files.write_json_atomic(tmp_path / "j.json", {"a": [1, None]}).read_text()) == {"a": [1, None]}
    files.save_safetensors({"x": torch.ones(2, dtype=torch.float16)}, tmp_path / "t.safetensors")
    assert torch.equal(load_file(tmp_path / "t.safetensors")["x"], torch.ones(2, dtype=torch.float16))


def test_an_error_while_writing_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "card.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with files.atomic_write(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["card.json"]


def test_a_directory_replaces_the_old_one_whole(tmp_path, fsynced):
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale.bin").write_text("from the last conversion")
    old = os.umask(0o022)
    try:
        with files.atomic_write(target) as tmp:
            tmp.mkdir()
            (tmp / "weights.safetensors").write_text("w")
            os.chmod(tmp / "weights.safetensors", 0o600)  # as safetensors writes it
            (tmp / "config.json").write_text("{}")
    finally:
        os.umask(old)
    assert sorted(f.name for f in target.iterdir()) == ["config.json", "weights.safetensors"]
    assert oct((target / "weights.safetensors").stat().st_mode & 0o777) == "0o644"
    assert {_id(target / "weights.safetensors"), _id(target), _id(tmp_path)} <= set(fsynced)
    assert [f.name for f in tmp_path.iterdir()] == ["model"]


def test_temporaries_are_told_apart_from_other_files(tmp_path):
    with files.atomic_write(tmp_path / "a.safetensors") as tmp:
        assert files.is_temporary(tmp) and tmp.parent == tmp_path
        tmp.write_text("x")
    assert not files.is_temporary(tmp_path / "a.safetensors")
