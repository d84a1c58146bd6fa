"""The switch chip models a system config can name (``switch.model``). A switch with
extra in-switch units (the CAIS merge unit) is one more entry here; the fabric
builds whichever the config names."""

from __future__ import annotations

from cais.hw.cais_switch import CaisSwitch
from cais.config import ConfigError
from cais.hw.ep_switch import EpSwitch
from cais.hw.switch import NvlsSwitch, Switch

SWITCH_MODELS: dict[str, type[Switch]] = {
    "nvls": NvlsSwitch,
    "cais": CaisSwitch,
    "cais-ep": EpSwitch,
}


def switch_model(name: str) -> type[Switch]:
    """The switch class named ``name`` (``auto`` here is ``nvls``: whoever knows the
    workload resolves ``auto`` before building a machine); a ConfigError naming the
    valid ones otherwise."""
    if name == "auto":
        name = "nvls"
    try:
        return SWITCH_MODELS[name]
    except KeyError:
        raise ConfigError(f"field 'switch.model': unknown switch model '{name}'; valid: "
                          f"auto, {', '.join(SWITCH_MODELS)}") from None
