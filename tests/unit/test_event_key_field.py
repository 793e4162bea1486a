"""An event class's ``key`` must name something the event has: checked when the class is
defined, with the root exception type, not by every later write."""

from __future__ import annotations

import pytest
from pydantic import computed_field

from outboxkit.errors import ConfigurationError, OutboxkitError
from outboxkit.events import Event, Message
from outboxkit.outbox_plan import OutboxConfig, prepare

pytestmark = pytest.mark.unit


class OrderPlaced(Event, topic="orders", key="order_id"):
    order_id: str


def test_a_misspelt_key_field_fails_the_class_definition() -> None:
    with pytest.raises(ConfigurationError, match=r"Typo: key='order_idd' names no field") as err:

        class Typo(Event, topic="t", key="order_idd"):
            order_id: str

    assert isinstance(err.value, OutboxkitError)
    assert "order_id" in str(err.value)  # the fields there are, to spot the typo


def test_a_subclass_naming_a_missing_key_fails_too() -> None:
    with pytest.raises(ConfigurationError, match="names no field"):

        class Other(OrderPlaced, key="customer"):
            pass


@pytest.mark.parametrize("key", ["", 7])
def test_a_key_that_is_not_a_name_is_refused(key: object) -> None:
    with pytest.raises(ConfigurationError, match="key must name a field"):

        class Odd(Event, topic="t", key=key):  # type: ignore[arg-type]
            value: str


def test_fields_inherited_fields_properties_and_computed_fields_are_keys() -> None:
    class Inherited(OrderPlaced, topic="other"):
        note: str = ""

    class ByProperty(Event, topic="t", key="ref"):
        n: int

        @property
        def ref(self) -> str:
            return f"r-{self.n}"

    class ByComputed(Event, topic="t", key="ref"):
        n: int

        @computed_field  # type: ignore[prop-decorator]
        @property
        def ref(self) -> str:
            return f"c-{self.n}"

    class Forward(Event, topic="t", key="ref"):
        ref: Later  # not defined yet: the fields are known, their types not

    Later = str

    assert Inherited(order_id="o-1").outbox_key() == "o-1"
    assert ByProperty(n=1).outbox_key() == "r-1"
    assert ByComputed(n=2).outbox_key() == "c-2"
    Forward.model_rebuild()
    assert Forward(ref=Later("x")).outbox_key() == "x"
    row = prepare(Message.from_event(OrderPlaced(order_id="o-9")), OutboxConfig())
    assert row.message_key == "o-9"


def test_a_base_without_fields_leaves_the_key_to_its_subclasses() -> None:
    class Base(Event, topic="orders", key="order_id"):
        pass

    class Placed(Base):
        order_id: str

    assert Placed.outbox_spec().key_field == "order_id"
    with pytest.raises(ConfigurationError, match="order_id"):

        class Misnamed(Base):
            orderid: str
