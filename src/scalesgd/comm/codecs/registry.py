"""The one list of codecs and of their option families: the command line's choices, flags and help, validation,
`bench` mode names and the engines' wiring all read them.

Adding a codec is its module plus one `CODECS.add(name, CodecEntry(…))`; a codec with options of its own
registers them once as a family, `CODEC_OPTIONS.add(family, OptionsClass)`: a dataclass of `option(…)` fields,
each with its help, default and check, which the command line offers as `--FAMILY-FIELD`. A codec outside this
package registers the same way from a module named by an entry point in the group `scalesgd.codecs` (its
distribution's `entry_points.txt`: `[scalesgd.codecs]` then `NAME = module`), loaded the first time a registry
is read: every process of a run, the launcher's workers included, then knows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scalesgd.comm.codecs.base import Codec
from scalesgd.options import check_fields
from scalesgd.registry import Registry

PLUGINS = "scalesgd.codecs"  # the entry-point group of codecs registered from outside the package

CODEC_OPTIONS: Registry[type] = Registry("codec option family", plugins=PLUGINS)


class CodecOptions(Mapping):
    """One options object per registered family, its family's defaults where none was given."""

    def __init__(self, given: Mapping[str, Any] | None = None):
        given = dict(given or {})
        unknown = sorted(set(given) - set(CODEC_OPTIONS))
        if unknown:
            raise ValueError(f"codec option families {unknown} are not registered; known: {', '.join(CODEC_OPTIONS)}")
        self._by_family = {name: given.get(name) or cls() for name, cls in CODEC_OPTIONS.items()}

    @classmethod
    def of(cls, *options) -> CodecOptions:
        """From options objects, each taken as the family its class is registered for."""
        families = {cls_: name for name, cls_ in CODEC_OPTIONS.items()}
        stray = [type(o).__name__ for o in options if type(o) not in families]
        if stray:
            raise ValueError(f"{', '.join(stray)} is not a registered codec option family")
        return cls({families[type(o)]: o for o in options})

    def __getitem__(self, family: str):
        return self._by_family[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_family)

    def __len__(self) -> int:
        return len(self._by_family)

    def __repr__(self) -> str:
        return f"CodecOptions({self._by_family!r})"


@dataclass(frozen=True, init=False)
class CodecSettings:
    """What a codec is built with: each family's options (its defaults where not given) and what the run knows that
    codecs need: the random seed of their sampling, the steps per epoch (None where not known, as for a library user or a
    hook: epoch-based schedules are then off), and the optimizer's momentum (DGC's momentum correction moves it into
    the exchange).

        CodecSettings(TopkOptions(density=0.01), Fp8Options(headroom=64), seed=1)
    """

    options: CodecOptions
    seed: int = 0
    steps_per_epoch: int | None = None
    momentum: float = 0.0
    nesterov: bool = False

    def __init__(self, *options, seed: int = 0, steps_per_epoch: int | None = None, momentum: float = 0.0,
                 nesterov: bool = False):
        held = options[0] if len(options) == 1 and isinstance(options[0], CodecOptions) else CodecOptions.of(*options)
        for name, value in (("options", held), ("seed", seed), ("steps_per_epoch", steps_per_epoch),
                            ("momentum", momentum), ("nesterov", nesterov)):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class CodecEntry:
    """A codec's registration: how to build it, and what the engines and the validation must know of it."""

    help: str
    build: Callable[[CodecSettings], Codec] | None  # None: only a PyTorch hook under DDP stands for it
    family: str | None = None  # the option family it is built with (its options checked before it is built)
    engines: tuple[str, ...] | None = None  # the engines that take it (None: every one)
    torch_hook: Callable[[bool], object] | None = None  # under DDP, PyTorch's own (a `DdpHook`, None: its allreduce)
    needs_topology: bool = False  # its sum runs in the node and cross-node groups
    buckets: str | None = None  # the bucket plan it implies (None: --buckets or the planner decides)
    sparse: bool = False  # sends (index, value) pairs
    warm_start: int = 0  # plain (uncompressed) iterations it starts with of its own (PowerSGD's start_powerSGD_iter)
    wire_bytes: float | None = None  # a dense codec's bytes per element on the wire (what the simulator costs)

    def runs_on(self, engine: str) -> bool:
        return self.engines is None or engine in self.engines

    @property
    def simulated(self) -> bool:
        """Whether `scalesgd simulate` has a cost model for it: a dense codec of known width, or a sparse one."""
        return self.wire_bytes is not None or self.sparse

    @property
    def plannable(self) -> bool:
        """Whether the planner may merge layers into this codec's groups: sparse over all ranks (its timing model),
        with no bucket rule of its own."""
        return self.sparse and self.buckets is None and not self.needs_topology


CODECS: Registry[CodecEntry] = Registry("codec", plugins=PLUGINS)


def make_codec(name: str, settings: CodecSettings | None = None) -> Codec:
    """A fresh instance of the registered codec `name` (codecs may hold per-run state), its family's options checked
    first (UsageError naming the option: `fp8_headroom` 0.5: must be >= 1)."""
    entry = CODECS[name]
    if entry.build is None:
        raise ValueError(f"codec {name!r} has no scalesgd implementation: under DDP it is PyTorch's own hook")
    settings = settings or CodecSettings()
    if entry.family is not None:
        check_fields(settings.options[entry.family], prefix=entry.family)
    return entry.build(settings)
