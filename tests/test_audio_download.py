"""``data download librispeech-dev-clean`` against a local fake of the archive (nothing here touches the internet):
verified by size and sha256, unpacked whole into place, readable as an audio corpus; a wrong checksum, a broken
archive and an unreachable server each end in one line."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import pin_source

from compressive_transformer.core.config import DataConfig
from compressive_transformer.data import DownloadError, download, read_split, sources
from tests.test_data_download import Handler, server  # noqa: F401  (the local HTTP server fixture)

sf = pytest.importorskip("soundfile")
NAME = "librispeech-dev-clean"


def fake_librispeech(files: int = 3) -> bytes:
    """A tar.gz with LibriSpeech's layout: LibriSpeech/dev-clean/<speaker>/<chapter>/<id>.flac plus a text file."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(files):
            audio = io.BytesIO()
            t = np.arange(1600) / 16000
            sf.write(audio, (0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t)).astype(np.float32), 16000, format="FLAC")
            for name, data in (
                (f"LibriSpeech/dev-clean/{84 + i}/121123/{84 + i}-121123-0000.flac", audio.getvalue()),
                (f"LibriSpeech/dev-clean/{84 + i}/121123/{84 + i}-121123.trans.txt", b"HELLO\n"),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("LibriSpeech/LICENSE.TXT")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"cc"))
    return buf.getvalue()


@pytest.fixture
def served(server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:  # noqa: F811
    url, root = server
    blob = fake_librispeech()
    (root / "dev-clean.tar.gz").write_bytes(blob)
    pin_source(monkeypatch, NAME, size=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    return url, root


def test_the_pinned_source_is_the_published_archive() -> None:
    s = sources()[NAME]
    assert (s.filename, s.size) == ("dev-clean.tar.gz", 337_926_286)
    assert s.sha256 == "76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3"


def test_download_verifies_unpacks_and_reads_as_audio(tmp_path: Path, served: tuple[str, Path]) -> None:
    url, _ = served
    out = download(NAME, tmp_path / "data", base_url=url, progress=False)
    assert out == tmp_path / "data" / "LibriSpeech" / "dev-clean"
    assert sorted(p.name for p in (tmp_path / "data" / "LibriSpeech").iterdir()) == ["dev-clean"], "no temp folders"
    raw = read_split(DataConfig(format="audio", path=str(out)), "test")
    assert [len(d) for d in raw.documents] == [1600]  # 3 files split 90/5/5 by count: one per split
    Handler.requests = []
    assert download(NAME, tmp_path / "data", base_url=url, progress=False) == out
    assert Handler.requests == [], "a verified archive is never fetched again"


def test_a_wrong_checksum_and_a_broken_archive_are_one_line_errors(
    tmp_path: Path, served: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = served
    pin_source(monkeypatch, NAME, sha256="0" * 64)
    with pytest.raises(DownloadError, match="has sha256 .*, expected 0000") as e:
        download(NAME, tmp_path / "a", base_url=url, progress=False)
    assert "\n" not in str(e.value) and list((tmp_path / "a").iterdir()) == []
    broken = b"not a tar archive at all" * 10
    (root / "dev-clean.tar.gz").write_bytes(broken)
    pin_source(monkeypatch, NAME, size=len(broken), sha256=hashlib.sha256(broken).hexdigest())
    with pytest.raises(DownloadError, match="is not a valid tar archive") as e:
        download(NAME, tmp_path / "b", base_url=url, progress=False)
    assert "\n" not in str(e.value) and list((tmp_path / "b").iterdir()) == []


def test_offline_is_a_one_line_error(tmp_path: Path, served: tuple[str, Path]) -> None:
    url, _ = served
    with pytest.raises(DownloadError, match="failed .*--base-url") as e:
        download(NAME, tmp_path / "x", base_url=url + "/missing", progress=False)
    assert "\n" not in str(e.value)
