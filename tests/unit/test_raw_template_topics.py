"""Which existing topics a ``{topic}`` raw-topic template names (checked at the receiver's
start-up, receiver/topic_check.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from receiver.topic_check import template_topics

NAMES = ["raw.orders", "raw.a.b", "raw.", "rawx.orders", "orders.raw", "__consumer_offsets", "raw"]


def test_a_prefix_template_names_the_topics_with_that_prefix_and_something_after() -> None:
    assert template_topics("raw.{topic}", NAMES) == ["raw.a.b", "raw.orders"]


def test_a_suffix_and_an_infix_template() -> None:
    assert template_topics("{topic}.raw", NAMES) == ["orders.raw"]
    names = ["a.orders.z", "a..z", "a.x.z.z", "b.orders.z"]
    assert template_topics("a.{topic}.z", names) == ["a.orders.z", "a.x.z.z"]


def test_regex_characters_in_the_template_are_literal() -> None:
    assert template_topics("r.{topic}", ["rx1", "r.1"]) == ["r.1"]


def test_a_bare_template_names_nothing_and_internal_topics_never() -> None:
    assert template_topics("{topic}", NAMES) == []
    assert template_topics("__{topic}", ["__consumer_offsets"]) == []


TOPIC = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=12)


@given(
    prefix=TOPIC.filter(lambda t: not t.startswith("__")),
    suffix=st.sampled_from(["", ".raw", "-r"]),
    source=TOPIC,
    other=TOPIC,
)
def test_what_the_template_makes_is_found(
    prefix: str, suffix: str, source: str, other: str
) -> None:
    template = f"{prefix}.{{topic}}{suffix}"
    made = template.replace("{topic}", source)
    found = template_topics(template, [made, other])
    assert made in found
    named = (
        other.startswith(f"{prefix}.")
        and other.endswith(suffix)
        and len(other) > len(prefix) + 1 + len(suffix)
    )
    assert (other in found) == named
