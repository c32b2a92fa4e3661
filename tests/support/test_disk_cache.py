"""The cache folder is a trust boundary: created private, refused when others could write to it."""

import os
import stat

import pytest

from mlir_nn.support.disk_cache import UntrustedCacheError, cache_dir, writable


def _use(monkeypatch, folder):
    monkeypatch.setenv("MLIR_NN_CACHE_DIR", str(folder))
    return folder


def test_a_new_cache_folder_is_private(tmp_path, monkeypatch):
    folder = _use(monkeypatch, tmp_path / "new" / "cache")
    assert cache_dir() == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o722])
def test_a_folder_others_may_write_into_is_refused(tmp_path, monkeypatch, mode):
    folder = _use(monkeypatch, tmp_path / f"shared{mode:o}")
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UntrustedCacheError, match=f"may be written by other users .mode {mode:o}.*chmod go-w"):
        cache_dir()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a folder away needs root")
def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = _use(monkeypatch, tmp_path / "theirs")
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(UntrustedCacheError, match="belongs to user 65534, not to you"):
        cache_dir()


def test_a_folder_that_cannot_be_written_is_a_clear_error_for_those_who_need_it(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    for folder in (tmp_path / "file", tmp_path / "file" / "below"):
        _use(monkeypatch, folder)
        assert cache_dir() == folder  # readers find nothing there; writers say why they cannot write
        with pytest.raises(NotADirectoryError, match="cannot create its cache folder"):
            writable()
