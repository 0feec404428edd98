"""The words of a backend's late-system-message pill (proxy/serving/admin.py): what its chat
template does with a system message that is not first and what the proxy does about it."""

from __future__ import annotations

from proxy.serving.admin import late_system_words


def test_a_refusing_template_the_proxy_mends_is_said_mended() -> None:
    assert late_system_words("refused", "auto") == "late system messages: mended"
    assert late_system_words("hoisted", "on") == "late system messages: mended"


def test_each_other_answer_in_words() -> None:
    assert late_system_words("in-place", "auto") == "late system messages: kept in place"
    assert late_system_words("hoisted", "auto") == "late system messages: moved to the front"
    assert late_system_words("refused", "off") == (
        "late system messages: refused (compat.system_turns is off)"
    )
    assert late_system_words("unknown", "auto").startswith("late system messages: unknown")
    assert late_system_words(None, "auto") == "late system messages: not checked yet"
