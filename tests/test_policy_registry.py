"""One registration mechanism for every policy kind (`search/registry.py`): each kind's classes register under
their names, the config's field (or switch) chooses one, and an unknown name is refused with the field and
the valid names where policies are built — `preset_config`, `Search`, the runtime's `flush_policy`."""

from dataclasses import replace

import pytest

from specscale.config import LV_POLICIES, SearchConfig
from specscale.runtime.lazy_flush import LAZY_FLUSH, AdaptiveBudget, FixedTriggers, flush_policy
from specscale.search.dedup import DEDUP, ComputationDedup, OneExpansionPerChild
from specscale.search.lookahead import LOOKAHEAD, LookAhead, NoLookahead
from specscale.search.policy_set import build_policies
from specscale.search.presets import PRESETS, preset_config
from specscale.search.protocol import StartFrom
from specscale.search.pruning import PRUNING, SHORTCUT, NoShortcut, PerfectShortcut
from specscale.search.registry import Registry
from specscale.search.search import Search
from specscale.search.selection import SELECTION
from specscale.search.speculation import SPECULATION
from specscale.search.verification import VERIFICATION


def test_every_kind_reads_its_names_from_its_registry():
    """The names the presets use are registered (a kind may hold more: a new policy is one class)."""
    assert {"beam", "best_of_n", "dvts"} <= set(SELECTION.names())
    assert {"immediate", "lazy", "lazy_round", "per_request", "round"} <= set(VERIFICATION.names())
    assert {"eager", "none"} <= set(SPECULATION.names())
    assert {"none", "strict", "strict_ties"} <= set(PRUNING.names())
    assert {"adaptive", "fixed"} <= set(LAZY_FLUSH.names())
    assert SHORTCUT.names() == DEDUP.names() == LOOKAHEAD.names() == ("off", "on")


def test_the_servers_copy_of_the_lazy_flush_names_is_the_registrys():
    assert sorted(LV_POLICIES) == list(LAZY_FLUSH.names())


def test_a_switch_chooses_between_its_off_and_on_classes():
    policies = build_policies(SearchConfig(perfect_shortcut=True, dedup=True, lookahead=True))
    assert (type(policies.shortcut), type(policies.dedup), type(policies.lookahead)) == (
        PerfectShortcut, ComputationDedup, LookAhead)
    policies = build_policies(SearchConfig())
    assert (type(policies.shortcut), type(policies.dedup), type(policies.lookahead)) == (
        NoShortcut, OneExpansionPerChild, NoLookahead)


@pytest.mark.parametrize("field", ["selection", "verification", "speculation", "pruning"])
def test_an_unknown_name_is_refused_by_preset_config_and_by_search(field):
    message = rf"{field} must be one of \('[a-z_]+'(, '[a-z_]+')*\), got 'nonsense'"
    with pytest.raises(ValueError, match=message):
        preset_config(f"beam[{field}=nonsense]")
    with pytest.raises(ValueError, match=message):
        Search(replace(SearchConfig(), **{field: "nonsense"}))


def test_an_unknown_lazy_flush_policy_is_refused_where_it_is_built():
    with pytest.raises(ValueError, match=r"lv_policy must be one of \(.*'fixed'.*\), got 'sometimes'"):
        flush_policy(_unchecked(lv_policy="sometimes"), 64)
    assert isinstance(flush_policy(SearchConfig(lv_policy="adaptive"), 64), AdaptiveBudget)
    assert isinstance(flush_policy(SearchConfig(), 64), FixedTriggers)


def _unchecked(**fields) -> SearchConfig:
    """A config past SearchConfig's own checks (the lv_policy names it still checks for the server's schema)."""
    config = SearchConfig()
    for name, value in fields.items():
        object.__setattr__(config, name, value)
    return config


def test_a_new_policy_is_one_registered_class():
    kind: Registry[object] = Registry("pruning")

    @kind.register("none")
    class Keep:
        def __init__(self, config):
            self.config = config

    @kind.register("sloppy")
    class Sloppy(Keep):
        pass

    assert kind.names() == ("none", "sloppy") and kind.chosen(SearchConfig(pruning="sloppy")) is Sloppy
    assert kind.name_of(Sloppy(SearchConfig())) == "sloppy"
    with pytest.raises(ValueError, match="registered as 'sloppy' already"):
        kind.register("sloppy")(Keep)


def test_every_preset_builds():
    for name in PRESETS:
        assert build_policies(preset_config(name)).selection is not None


def test_a_head_start_keeps_its_share_of_the_tokens_at_least_one_and_one_fewer():
    written = list(range(10))
    assert StartFrom(0, 0.85).prefix_of(written) == written[:8]
    assert StartFrom(0, 0.0).prefix_of(written) == written[:1]
    assert StartFrom(0, 1.0).prefix_of(written) == written[:9]
    assert StartFrom(0, 0.5).prefix_of([7]) == []
