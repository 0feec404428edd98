"""Does drafting pay (proxy/serving/verdict.py): the start-up calibration's answer per load
level from the first minute, and the learned comparisons of the same load beside it."""

from __future__ import annotations

from typing import Any

from proxy.routing.calibration import Calibration, Cell
from proxy.serving.verdict import drafting_view, level_words

LEVELS = [1, 2, 4]
DEPTHS = {"m": {"off": 0, "min": 2, "max": 3}}


def calibration(slots: int = 4) -> Calibration:
    cells = [Cell(1, 0, 37.7, 2), Cell(1, 3, 69.3, 2)]
    if slots > 1:
        cells += [Cell(2, 0, 30.0, 2), Cell(2, 3, 33.0, 2)]
        cells += [Cell(slots, 0, 25.0, slots), Cell(slots, 3, 20.0, slots)]
    return Calibration("k", "bin", "m", slots, tuple(cells), 1.0, 1.0, measured_at=5.0)


def learned(level: int, profile: str, tok_s: float, samples: int = 5) -> dict[str, Any]:
    return {
        "model": "m",
        "bucket": "<4k",
        "kind": "code",
        "level": level,
        "profile": profile,
        "decode_tok_s": tok_s,
        "samples": samples,
        "trusted": samples >= 5,
    }


def test_the_calibration_answers_before_anything_was_learned() -> None:
    (row,) = drafting_view(
        {"m/one-process": calibration()}, {"m/one-process": "m"}, DEPTHS, [], LEVELS
    )
    assert (row["backend"], row["model"], row["deepest"]) == ("m/one-process", "m", 3)
    alone, two, four = row["levels"]
    assert (alone["words"], alone["off_tok_s"], alone["deep_tok_s"]) == ("alone", 37.7, 69.3)
    assert alone["ratio"] == 1.838 and alone["pays"] and alone["learned"] == []
    assert (two["words"], two["pays"]) == ("2-3 decoding", True)
    assert (four["words"], four["ratio"], four["pays"]) == ("4+ decoding", 0.8, False)
    assert row["verdict"] == (
        "alone, drafting pays: depth 3 decodes 1.84x as fast as depth 0; "
        "2-3 decoding, drafting pays: depth 3 decodes 1.10x as fast as depth 0; "
        "4+ decoding, off wins: depth 3 decodes 0.80x as fast as depth 0"
    )


def test_a_one_slot_process_is_measured_alone_only() -> None:
    (row,) = drafting_view(
        {"m/one-process": calibration(1)}, {"m/one-process": "m"}, DEPTHS, [], LEVELS
    )
    assert [level["level"] for level in row["levels"]] == [1]


def test_learned_comparisons_sit_beside_the_calibration_of_their_own_load_only() -> None:
    """off learned busy and max learned alone make no comparison: different loads."""
    rows = [learned(1, "max", 60.0), learned(2, "off", 30.0), learned(1, "off", 40.0, 3)]
    (row,) = drafting_view(
        {"m/one-process": calibration()}, {"m/one-process": "m"}, DEPTHS, rows, LEVELS
    )
    alone, two, _ = row["levels"]
    (same,) = alone["learned"]
    assert (same["request_class"], same["profile"], same["depth"]) == ("<4k/code", "max", 3)
    assert (same["speedup"], same["samples"], same["trusted"]) == (1.5, [3, 5], False)
    assert two["learned"] == []  # off alone at 2-3: no depth beside it at that load


def test_a_busy_level_measured_at_another_load_says_so_and_is_shown_once() -> None:
    two_slots = Calibration(
        "k", "bin", "m", 2, (Cell(1, 0, 10.0, 1), Cell(1, 3, 20.0, 1), Cell(2, 0, 9.0, 2),
                             Cell(2, 3, 8.0, 2)), 1.0, 1.0,
    )  # fmt: skip
    (row,) = drafting_view({"m/one-process": two_slots}, {"m/one-process": "m"}, DEPTHS, [], LEVELS)
    assert [level["level"] for level in row["levels"]] == [1, 2]  # 4 is measured as 2 is


def test_a_backend_gone_is_left_out() -> None:
    assert drafting_view({"gone/one-process": calibration()}, {}, DEPTHS, [], LEVELS) == []


def test_level_words() -> None:
    assert [level_words(n, LEVELS) for n in (0, 1, 2, 4)] == [
        "any load (pool)",
        "alone",
        "2-3 decoding",
        "4+ decoding",
    ]
    assert level_words(2, [1, 2, 3]) == "2 decoding"
