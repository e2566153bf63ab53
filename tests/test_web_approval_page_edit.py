"""The page's Edit control on a waiting tool card, in a real browser (Chromium, driven by
Playwright, as in tests/test_web_approval_page.py): Edit shows the call's input as JSON
in a box, "Approve with edits" sends it as ``approval.axonEditedInput`` and the tool runs
with it; the card shows the input that ran, live and after a reload. An edit the server
refuses (its 400) is shown on the card, which keeps asking with the box as typed."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.test_web_approval_page import ask, deleted, drive
from tests.test_web_approval_page import playwright_sync as playwright_sync  # the fixture


def chat_posts(page: Any) -> list[Any]:
    """The JSON bodies of the page's ``POST /api/chat`` requests, as they are sent."""
    sent: list[Any] = []
    page.on(
        "request",
        lambda r: (
            sent.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith("/api/chat")
            else None
        ),
    )
    return sent


async def test_edit_then_approve_runs_the_call_with_the_edited_input(playwright_sync):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        sent = chat_posts(page)
        card = ask(page, expect, "please delete /tmp/x")
        card.get_by_role("button", name="Edit").click()
        box = card.get_by_label("Edited input")
        expect(box).to_have_value('{\n  "path": "/tmp/x"\n}')
        box.fill('{"path": "/tmp/edited"}')
        card.get_by_role("button", name="Approve with edits").click()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(card.locator(".result pre")).to_have_text("deleted /tmp/edited")
        expect(card.locator(".input pre")).to_contain_text('"path": "/tmp/edited"')
        expect(card.locator(".input .label")).to_have_text("Input (edited)")
        expect(page.locator(".msg.assistant .text")).to_have_text("Results: deleted /tmp/edited.")
        seen["sent"] = sent
        page.reload()  # what the server stored: the input that ran, marked edited
        card = page.locator(".tool-card").first
        expect(card).to_have_attribute("data-state", "output-available")
        expect(card.locator(".input pre")).to_contain_text('"path": "/tmp/edited"')
        expect(card.locator(".input .label")).to_have_text("Input (edited)")
        seen["reloaded_edited"] = card.get_attribute("data-edited")

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert deleted == ["/tmp/edited"]
    (part,) = [p for p in seen["sent"][-1]["messages"][-1]["parts"] if p.get("toolCallId") == "D0"]
    assert part["input"] == {"path": "/tmp/x"}  # the call as streamed
    assert part["approval"]["axonEditedInput"] == {"path": "/tmp/edited"}
    assert seen["reloaded_edited"] == "1"


async def test_a_refused_edit_is_shown_on_the_card_which_keeps_asking(playwright_sync):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "please delete /tmp/x")
        card.get_by_role("button", name="Edit").click()
        box = card.get_by_label("Edited input")
        box.fill("{not json")
        card.get_by_role("button", name="Approve with edits").click()
        expect(card.locator(".edit-error")).to_contain_text("not JSON")
        box.fill('{"path": 5}')  # JSON, but the tool's schema refuses it: the server's 400
        card.get_by_role("button", name="Approve with edits").click()
        expect(card.locator(".edit-error")).to_contain_text("400")
        expect(card).to_have_attribute("data-state", "approval-requested")
        box = card.get_by_label("Edited input")
        expect(box).to_have_value('{"path": 5}')
        expect(card.locator(".input pre")).to_contain_text('"path": "/tmp/x"')
        seen["deleted_after_refusal"] = list(deleted)
        box.fill('{"path": "/tmp/fixed"}')
        card.get_by_role("button", name="Approve with edits").click()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(card.locator(".result pre")).to_have_text("deleted /tmp/fixed")
        seen["errors_left"] = card.locator(".edit-error").count()

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["deleted_after_refusal"] == []
    assert seen["errors_left"] == 0
    assert deleted == ["/tmp/fixed"]


async def test_a_passed_up_approval_is_edited_as_the_sub_agents_call_live_and_after_reloads(
    playwright_sync,
):
    """An agent tool's call whose sub-agent passed its approval up
    (``as_tool(pass_approvals=True)``): the card shows the sub call that asks
    (``wire_money``, from the request's ``approvalDescriptor``), reloaded the same (the
    UI message's ``approval.descriptor``); Edit opens on that call's input, a refused
    edit shows its 400 on the card, and "Approve with edits" runs the edit once in the
    sub-agent; reloaded, the card shows what ran, marked edited."""
    from tests.test_approval_nested_pass import parent, ran
    from tests.test_web_approval_page import run_page
    from tests.web.harness import web_server

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        sent = chat_posts(page)
        card = ask(page, expect, "pay x")
        expect(card.locator(".t-name")).to_have_text("helper")
        expect(card).to_have_attribute("data-asked-tool", "wire_money")
        expect(card.locator(".asked .label")).to_have_text("Asks to run wire_money")
        expect(card.locator(".asked pre")).to_have_text('{\n  "to": "x"\n}')
        page.reload()  # waiting: the stored UI message names the same call
        card = page.locator(".tool-card").first
        expect(card).to_have_attribute("data-state", "approval-requested")
        expect(card.locator(".asked .label")).to_have_text("Asks to run wire_money")
        expect(card.locator(".asked pre")).to_have_text('{\n  "to": "x"\n}')
        expect(card.locator(".input pre")).to_contain_text('"input": "pay x"')
        card.get_by_role("button", name="Edit").click()
        expect(card.locator(".edit-box .label")).to_have_text("Edit the input of wire_money (JSON)")
        box = card.get_by_label("Edited input")
        expect(box).to_have_value('{\n  "to": "x"\n}')
        box.fill('{"to": 5}')  # JSON, but wire_money's schema refuses it: the server's 400
        card.get_by_role("button", name="Approve with edits").click()
        expect(card.locator(".edit-error")).to_contain_text("400")
        expect(card).to_have_attribute("data-state", "approval-requested")
        expect(card.locator(".asked pre")).to_have_text('{\n  "to": "x"\n}')
        seen["ran_after_refusal"] = list(ran)
        card.get_by_label("Edited input").fill('{"to": "y"}')
        card.get_by_role("button", name="Approve with edits").click()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(card.locator(".result pre")).to_have_text("paid")
        expect(card.locator(".asked .label")).to_have_text("Runs wire_money with (edited)")
        expect(card.locator(".asked pre")).to_contain_text('"to": "y"')
        expect(card.locator(".input pre")).to_contain_text('"input": "pay x"')
        expect(page.locator(".msg.assistant .text")).to_have_text("parent saw: paid")
        seen["sent"] = sent
        page.reload()  # what the server stored: the edit, on the asking call
        card = page.locator(".tool-card").first
        expect(card).to_have_attribute("data-state", "output-available")
        expect(card.locator(".asked .label")).to_have_text("Runs wire_money with (edited)")
        expect(card.locator(".asked pre")).to_contain_text('"to": "y"')
        expect(card.locator(".input pre")).to_contain_text('"input": "pay x"')
        seen["reloaded_edited"] = card.get_attribute("data-edited")
        seen["buttons"] = card.locator("button").count()

    ran.clear()
    async with web_server(parent()) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    assert seen["ran_after_refusal"] == []
    assert ran == ["y"]  # once, the edit, in the sub-agent
    (part,) = [p for p in seen["sent"][-1]["messages"][-1]["parts"] if p.get("toolCallId") == "H"]
    assert part["input"] == {"input": "pay x"}  # the agent tool's call as streamed
    assert part["approval"]["axonEditedInput"] == {"to": "y"}
    assert part["approval"]["descriptor"]["axonAskedTool"] == "wire_money"
    assert seen["reloaded_edited"] == "1" and seen["buttons"] == 0


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
async def test_a_plainly_decided_passed_up_approval_no_longer_reads_as_asking(
    playwright_sync, approved
):
    """A passed-up approval approved (or denied) as asked, no edit: its card kept saying
    "Asks to run wire_money" after the decision, live and reloaded, as if still asking.
    It says the decision now, as an edited one says what ran."""
    from tests.test_approval_nested_pass import parent, ran
    from tests.test_web_approval_page import run_page
    from tests.web.harness import web_server

    said = "Approved to run wire_money" if approved else "Denied running wire_money"

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "pay x")
        expect(card.locator(".asked .label")).to_have_text("Asks to run wire_money")
        card.get_by_role("button", name="Approve" if approved else "Deny").click()
        expect(page.locator(".msg.assistant .text").last).to_contain_text("parent saw")
        expect(page.locator("body")).to_have_attribute("data-busy", "")
        seen["live"] = card.locator(".asked .label").text_content()
        seen["live_text"] = page.locator(".msg.assistant .text").last.text_content()
        page.reload()
        card = page.locator(".tool-card").first
        expect(card.locator(".asked pre")).to_have_text('{\n  "to": "x"\n}')
        seen["reloaded"] = card.locator(".asked .label").text_content()
        seen["edited"] = card.get_attribute("data-edited")
        seen["buttons"] = card.locator("button").count()

    ran.clear()
    async with web_server(parent()) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    assert ran == (["x"] if approved else [])
    assert seen["live_text"].startswith("parent saw: " + ("paid" if approved else "not paid"))
    assert (seen["live"], seen["reloaded"]) == (said, said)  # ("Asks to run ..." both)
    assert seen["edited"] is None and seen["buttons"] == 0


async def test_a_card_two_agents_deep_names_the_agents_it_is_asked_through(playwright_sync):
    """``top`` calls ``middle``, whose ``helper`` asks: the card said "Asks to run
    wire_money" with no word of ``helper`` between (``asked_via``); it names it now,
    asking, decided, and reloaded."""
    from tests.test_approval_nested_pass import _grand_parent, ran
    from tests.test_web_approval_page import run_page
    from tests.web.harness import web_server

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "have x paid")
        seen["asking"] = card.locator(".asked .label").text_content()
        card.get_by_role("button", name="Approve").click()
        expect(page.locator(".msg.assistant .text").last).to_contain_text("top saw")
        seen["live"] = card.locator(".asked .label").text_content()
        page.reload()
        card = page.locator(".tool-card").first
        expect(card).to_have_attribute("data-state", "output-available")
        seen["reloaded"] = card.locator(".asked .label").text_content()

    ran.clear()
    async with web_server(_grand_parent()) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    assert ran == ["x"]
    assert seen["asking"] == "Asks to run wire_money via helper"  # (no "via helper" before)
    assert seen["live"] == seen["reloaded"] == "Approved to run wire_money via helper"


RLO = "\u202e"
SPOOF = f"/tmp/{RLO}fdp.exe"  # shown raw, it reads "/tmp/exe.pdf"


async def test_a_bidi_override_in_an_input_is_shown_escaped_and_an_untouched_edit_keeps_it(
    playwright_sync,
):
    """The card showed an input holding U+202E raw: the rest of its line displayed
    reversed, so a person approved "/tmp/exe.pdf" and ``/tmp/<RLO>fdp.exe`` ran. Shown
    as ``\\u202e`` now (as the command line shows it); the edit box's JSON escape is the
    same value, so an edit left as it is runs the call's very input."""

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        sent = chat_posts(page)
        card = ask(page, expect, f"please delete {SPOOF}")
        seen["shown"] = card.locator(".input pre").inner_text()
        card.get_by_role("button", name="Edit").click()
        seen["box"] = card.get_by_label("Edited input").input_value()
        card.get_by_role("button", name="Approve with edits").click()
        expect(card).to_have_attribute("data-state", "output-available")
        seen["result"] = card.locator(".result pre").inner_text()
        seen["sent"] = sent

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert RLO not in seen["shown"] and "/tmp/\\u202efdp.exe" in seen["shown"]
    assert RLO not in seen["box"] and RLO not in seen["result"]
    assert deleted == [SPOOF]
    (part,) = [p for p in seen["sent"][-1]["messages"][-1]["parts"] if p.get("toolCallId") == "D0"]
    assert part["approval"]["axonEditedInput"] == {"path": SPOOF}
