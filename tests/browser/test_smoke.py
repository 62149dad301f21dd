"""The browser harness itself: system Chromium through Playwright, no download."""

from __future__ import annotations


def test_system_chromium_renders_and_escapes(browser_context):
    page = browser_context.new_page()
    page.set_content("<p id=t></p><script>document.getElementById('t').textContent='<b>x</b>'</script>")
    assert page.inner_text("#t") == "<b>x</b>"
    assert page.locator("b").count() == 0
