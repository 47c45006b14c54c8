"""Download helpers against a local HTTP server on 127.0.0.1 (nothing here touches the internet)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import threading
import urllib.parse
import zipfile
from functools import partial
from pathlib import Path
from typing import Iterator

import pytest
from conftest import pin_source

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data import DownloadError, download, read_documents, read_pg19_metadata


class Handler(http.server.SimpleHTTPRequestHandler):
    """Static files, plus a GCS JSON-API style listing at /storage/v1/b/<bucket>/o paged two items at a time."""

    requests: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        Handler.requests.append(self.path)
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts[:3] == ["storage", "v1", "b"] and parts[4:] == ["o"]:
            return self._listing(Path(self.directory) / parts[3], urllib.parse.parse_qs(url.query))
        return super().do_GET()

    def _listing(self, bucket: Path, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        names = sorted(str(p.relative_to(bucket)) for p in bucket.rglob("*") if p.is_file())
        names = [n for n in names if n.startswith(prefix)]
        start = int(query.get("pageToken", ["0"])[0])
        page = {
            "items": [
                {
                    "name": n,
                    "size": str((bucket / n).stat().st_size),
                    "md5Hash": base64.b64encode(hashlib.md5((bucket / n).read_bytes()).digest()).decode(),
                }
                for n in names[start : start + 2]
            ]
        }
        if start + 2 < len(names):
            page["nextPageToken"] = str(start + 2)
        body = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    Handler.requests = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def fake_enwik8_zip(content: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", content)
    return buf.getvalue()


@pytest.fixture
def enwik8_served(server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    url, root = server
    content = b"<mediawiki> fake enwik8 text\n" * 400
    blob = fake_enwik8_zip(content)
    (root / "enwik8.zip").write_bytes(blob)
    pin_source(
        monkeypatch, "enwik8", size=len(blob), sha256=hashlib.sha256(blob).hexdigest(), members={"enwik8": len(content)}
    )
    return url, content


def test_enwik8_download_verifies_extracts_and_is_readable(tmp_path: Path, enwik8_served: tuple[str, bytes]) -> None:
    url, content = enwik8_served
    out = download("enwik8", tmp_path / "data", base_url=url, progress=False)
    assert out == tmp_path / "data" / "enwik8" and out.read_bytes() == content
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["enwik8", "enwik8.zip"], "no temp files left"
    with pytest.warns(UserWarning, match="proportionally"):
        assert len(read_documents(DataConfig(format="enwik8", path=str(out)), "train")[0]) == round(0.9 * len(content))

    zip_mtime = (tmp_path / "data" / "enwik8.zip").stat().st_mtime_ns
    Handler.requests = []
    assert download("enwik8", tmp_path / "data", base_url=url, progress=False) == out
    assert Handler.requests == [], "a verified file is never fetched again"
    assert (tmp_path / "data" / "enwik8.zip").stat().st_mtime_ns == zip_mtime


def test_checksum_mismatch_deletes_the_temp_file(
    tmp_path: Path, enwik8_served: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = enwik8_served
    pin_source(monkeypatch, "enwik8", sha256="0" * 64)
    with pytest.raises(DownloadError, match="has sha256 .*, expected 0000") as e:
        download("enwik8", tmp_path / "data", base_url=url, progress=False)
    assert "\n" not in str(e.value) and isinstance(e.value, ConfigError)
    assert list((tmp_path / "data").iterdir()) == []


def test_size_mismatch_and_bad_zip_are_rejected(
    tmp_path: Path, server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, root = server
    (root / "enwik8.zip").write_bytes(b"this is not a zip archive")
    blob = (root / "enwik8.zip").read_bytes()
    pin_source(monkeypatch, "enwik8", size=len(blob) + 1, sha256=None)
    with pytest.raises(DownloadError, match="expected 26"):
        download("enwik8", tmp_path / "a", base_url=url, progress=False)
    pin_source(
        monkeypatch,
        "enwik8",
        size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
    )
    with pytest.raises(DownloadError, match="not a valid zip"):
        download("enwik8", tmp_path / "b", base_url=url, progress=False)
    assert list((tmp_path / "b").iterdir()) == []
    right = fake_enwik8_zip(b"x" * 10)
    (root / "enwik8.zip").write_bytes(right)
    pin_source(monkeypatch, "enwik8", size=len(right), sha256=hashlib.sha256(right).hexdigest(), members={"enwik8": 11})
    with pytest.raises(DownloadError, match="unpacks to 10 bytes, expected 11"):
        download("enwik8", tmp_path / "c", base_url=url, progress=False)


def test_corrupt_existing_file_is_replaced(tmp_path: Path, enwik8_served: tuple[str, bytes]) -> None:
    url, content = enwik8_served
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "enwik8.zip").write_bytes(b"truncated")
    out = download("enwik8", tmp_path / "data", base_url=url, progress=False)
    assert out.read_bytes() == content


def test_unreachable_server_is_a_one_line_error(tmp_path: Path, enwik8_served: tuple[str, bytes]) -> None:
    url, _ = enwik8_served
    with pytest.raises(DownloadError, match="failed .*--base-url") as e:
        download("enwik8", tmp_path / "x", base_url=url + "/missing", progress=False)
    assert "\n" not in str(e.value)
    assert list((tmp_path / "x").iterdir()) == []


def test_wikitext_archive_layout(tmp_path: Path, server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, root = server
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for s in ("train", "valid", "test"):
            z.writestr(f"wikitext-103/wiki.{s}.tokens", f" \n = {s} = \n \n words of {s} \n")
    (root / "wikitext-103-v1.zip").write_bytes(buf.getvalue())
    pin_source(monkeypatch, "wikitext-103", size=len(buf.getvalue()), sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    out = download("wikitext-103", tmp_path, base_url=url, progress=False)
    assert out == tmp_path / "wikitext-103"
    cfg = DataConfig(format="wikitext", path=str(out), tokenizer="words")
    assert read_documents(cfg, "train")[0].split()[-4:] == ["words", "of", "train", "<eos>"]


def test_pg19_listing_pagination_limit_and_md5(tmp_path: Path, server: tuple[str, Path]) -> None:
    url, root = server
    bucket = root / "deepmind-gutenberg"
    books = {"train": ["10", "11", "12", "13", "14"], "validation": ["20", "21"], "test": ["30"]}
    for split, ids in books.items():
        (bucket / split).mkdir(parents=True)
        for i in ids:
            (bucket / split / f"{i}.txt").write_text(f"book {i} " * 50, encoding="utf-8")
    (bucket / "metadata.csv").write_text(
        "".join(f'{i},"Title {i}",1900,http://x/{i}\n' for ids in books.values() for i in ids)
    )
    out = download("pg19", tmp_path, base_url=url, progress=False, limit=3)
    assert out == tmp_path / "pg19"
    assert sorted(p.stem for p in (out / "train").iterdir()) == ["10", "11", "12"], "limit = books per split"
    assert sorted(p.stem for p in (out / "validation").iterdir()) == ["20", "21"]
    assert len(read_pg19_metadata(out)) == 8
    assert read_documents(DataConfig(format="pg19", path=str(out)), "test") == ["book 30 " * 50]
    assert any("pageToken=2" in r for r in Handler.requests), "listing follows nextPageToken"

    Handler.requests = []
    download("pg19", tmp_path, base_url=url, progress=False, limit=3)
    assert not [r for r in Handler.requests if r.endswith(".txt")], "verified books are not fetched again"

    # a book that changed on the server (listing md5 != local copy) is fetched again
    (bucket / "test" / "30.txt").write_text("new text", encoding="utf-8")
    download("pg19", tmp_path, base_url=url, progress=False, limit=3)
    assert (out / "test" / "30.txt").read_text() == "new text"


def test_download_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown corpus 'enwik9'"):
        download("enwik9", tmp_path)
    with pytest.raises(ConfigError, match="apply to pg19 only"):
        download("enwik8", tmp_path, limit=3)
    with pytest.raises(ConfigError, match="limit must be >= 1"):
        download("pg19", tmp_path, limit=0)
