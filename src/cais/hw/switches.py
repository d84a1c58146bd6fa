"""The switch chip models a system config can name (``switch.model``). A switch with
extra in-switch units (the CAIS merge unit) is one more entry here; the fabric
builds whichever the config names."""

from __future__ import annotations

from cais.hw.config import ConfigError
from cais.hw.switch import NvlsSwitch, Switch

SWITCH_MODELS: dict[str, type[Switch]] = {
    "nvls": NvlsSwitch,
}


def switch_model(name: str) -> type[Switch]:
    """The switch class named ``name``; a ConfigError naming the valid ones otherwise."""
    try:
        return SWITCH_MODELS[name]
    except KeyError:
        raise ConfigError(f"field 'switch.model': unknown switch model '{name}'; valid: "
                          f"{', '.join(SWITCH_MODELS)}") from None
