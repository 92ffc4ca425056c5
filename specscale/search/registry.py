"""One registration mechanism for every kind of policy (docs/design.md, "Search semantics").

A kind (selection, verification, speculation, pruning, perfect-score shortcut, lookahead, dedup, the runtime's
lazy-flush policy) is one `Registry`, declared beside its base class, and each policy class registers itself
under its name:

    PRUNING = Registry[NoPruning]("pruning")

    @PRUNING.register("strict")
    class StrictPruning(NoPruning): ...

The registry reads the name from the `SearchConfig` field it is declared for. A text field names the class
(`pruning="strict"`); a switch (`Registry(..., switch=True)`, a bool field such as `dedup`) chooses between the
classes registered as "off" and "on". The names a config may use are the registry's (`names()`): nothing else
keeps a list of them, and an unknown name is a `ValueError` naming the field and the valid names when the
policies are built (`search/policy_set.py`, the runtime's `flush_policy`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from specscale.config import SearchConfig

P = TypeVar("P")

OFF, ON = "off", "on"  # the names of a switch's two classes


class Registry(Generic[P]):
    """The classes of one policy kind (subclasses of P), by name; `field` is the SearchConfig field naming one."""

    def __init__(self, field: str, switch: bool = False):
        self.field = field
        self.switch = switch
        self._classes: dict[str, type[P]] = {}

    def register(self, name: str) -> Callable[[type[P]], type[P]]:
        """A class decorator: the class is this kind's policy called `name`."""

        def add(cls: type[P]) -> type[P]:
            if name in self._classes:
                raise ValueError(f"{self.field}: a policy is registered as {name!r} already")
            self._classes[name] = cls
            return cls

        return add

    def names(self) -> tuple[str, ...]:
        """The names a config may use, sorted."""
        return tuple(sorted(self._classes))

    def name_in(self, config: SearchConfig) -> str:
        """The name config chooses: its field's text, or "on" / "off" for a switch."""
        value = getattr(config, self.field)
        if self.switch:
            return ON if value else OFF
        return value

    def chosen(self, config: SearchConfig) -> type[P]:
        """The class config names; a ValueError naming the field and the valid names if there is none."""
        name = self.name_in(config)
        if name not in self._classes:
            raise ValueError(f"{self.field} must be one of {self.names()}, got {name!r}")
        return self._classes[name]

    def name_of(self, policy: object) -> str:
        """The name the policy's class is registered under (tracing, tests)."""
        return next(name for name, cls in self._classes.items() if type(policy) is cls)
