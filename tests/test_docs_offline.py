"""``/docs`` works offline: every script and stylesheet it names is served by the app itself."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin, urlparse

import pytest


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script" and named.get("src"):
            self.urls.append(named["src"] or "")
        if tag == "link" and "stylesheet" in (named.get("rel") or "") and named.get("href"):
            self.urls.append(named["href"] or "")


@pytest.mark.parametrize("auth", ["off", "on"])
def test_docs_reference_only_same_origin_assets_that_answer(app_factory, auth):
    app = app_factory(auth=auth, admin_token="admin-token-for-docs", allowed_hosts=("loom.test",))
    client = app.test_client()
    page = client.get("/docs", base_url="http://loom.test")
    assert page.status_code == 200
    parser = _Assets()
    parser.feed(page.get_data(as_text=True))
    assert any(url.endswith(".js") for url in parser.urls)
    assert any(url.endswith(".css") for url in parser.urls)
    for url in parser.urls:
        absolute = urlparse(urljoin("http://loom.test/docs", url))
        assert (absolute.scheme, absolute.netloc) == ("http", "loom.test"), url
        asset = client.get(absolute.path, base_url="http://loom.test")
        assert asset.status_code == 200, url
        assert len(asset.get_data()) > 1000, url
        asset.close()
