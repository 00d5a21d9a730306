"""Machine descriptions as data: GPUs per node, links, copy engines (``machines/*.json``).

A description is measured (``"measured": true``: ficco ran on it) or taken from vendor figures
(``false``: its ``source`` names them). The cost model scales its calibrated efficiencies by
these figures, so a machine never measured is predicted from its links, never guessed from
another machine's timings. Peers on the same node talk over ``nvlink``; peers on other nodes
over ``nic`` (one NIC per GPU, rail-optimized), which a single-node machine need not name.
``gather`` (optional) prices embedding-bag pooling (emb_a2a): its bandwidths are measured on
the machine or ``derived`` from another's (``ficco.model.gather``); without it the model
refuses emb_a2a. ``tflops`` (optional): the card's dense tensor-core peak per dtype
(``ficco.dtypes`` names), the roof of the physical floor no timing may beat
(``ficco.measure.floor``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MACHINES_DIR = Path(__file__).with_name("machines")


@dataclass(frozen=True, slots=True)
class Link:
    gbs_per_direction: float
    """Bandwidth one GPU injects into (or takes from) this link type, GB/s per direction."""
    latency_us: float
    """Fixed time of one hop, microseconds (software fixed costs are calibrated separately)."""

    @property
    def bytes_per_ms(self) -> float:
        return self.gbs_per_direction * 1e6


@dataclass(frozen=True, slots=True)
class Gather:
    """Embedding-bag pooling's bandwidth: rows gathered plus pooled rows written, per second."""

    triton_gbs: float
    """ficco's Triton pooling kernel, GB/s."""
    torch_gbs: float
    """torch's pooling (the executor's path for the ``cublas`` compute choice), GB/s."""
    fixed_us: float
    """One pooling launch's fixed time, microseconds."""
    derived: bool
    """True where the figures are another machine's efficiencies scaled to this one's HBM."""
    source: str


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    description: str
    measured: bool
    source: str
    gpu: str
    gpus_per_node: int
    nodes: int
    sm_count: int
    copy_engines_per_gpu: int
    hbm_gbs: float
    links: dict[str, Link]
    gather: Gather | None = None
    tflops: dict[str, float] | None = None
    """Dense tensor-core peak, TFLOP/s, per dtype name (None: not described)."""

    @property
    def world(self) -> int:
        """GPUs in all: the largest W this machine runs."""
        return self.gpus_per_node * self.nodes

    def link_between(self, rank: int, peer: int) -> Link:
        """The link a transfer between two ranks crosses (ranks fill nodes in order)."""
        same_node = rank // self.gpus_per_node == peer // self.gpus_per_node
        return self.links["nvlink" if same_node else "nic"]

    def slowest_link(self, world: int) -> Link:
        """The link that bounds a collective over ``world`` ranks (a ring crosses nodes)."""
        return self.links["nic" if world > self.gpus_per_node else "nvlink"]


def _require(data: dict, key: str, kind: type | tuple, where: str):
    if key not in data:
        raise ValueError(f"{where}: missing field {key!r}")
    value = data[key]
    if isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}: field {key!r} must be {kind}, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(f"{where}: field {key!r} must be {kind}, got {value!r}")
    return value


def machine_from_dict(data: dict, where: str = "machine") -> Machine:
    """A Machine from its JSON form; raises ValueError naming the field that is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    number = (int, float)
    links_raw = _require(data, "links", dict, where)
    links = {}
    for name, raw in links_raw.items():
        if name not in ("nvlink", "nic", "pcie"):
            raise ValueError(f"{where}: link {name!r}: link types are nvlink, nic, pcie")
        bw = _require(raw, "gbs_per_direction", number, f"{where}: link {name}")
        lat = _require(raw, "latency_us", number, f"{where}: link {name}")
        if bw <= 0 or lat < 0:
            raise ValueError(f"{where}: link {name}: bandwidth must be > 0 and latency >= 0")
        links[name] = Link(float(bw), float(lat))
    gather = None
    if "gather" in data:
        raw = _require(data, "gather", dict, where)
        at = f"{where}: gather"
        gather = Gather(
            triton_gbs=float(_require(raw, "triton_gbs", number, at)),
            torch_gbs=float(_require(raw, "torch_gbs", number, at)),
            fixed_us=float(_require(raw, "fixed_us", number, at)),
            derived=_require(raw, "derived", bool, at),
            source=_require(raw, "source", str, at),
        )
        if gather.triton_gbs <= 0 or gather.torch_gbs <= 0 or gather.fixed_us < 0:
            raise ValueError(f"{at}: bandwidths must be > 0 and fixed_us >= 0")
    if "nvlink" not in links:
        raise ValueError(f"{where}: links: an nvlink entry is required (the intra-node link)")
    tflops = None
    if "tflops" in data:
        from ficco.dtypes import DTYPES

        raw = _require(data, "tflops", dict, where)
        tflops = {}
        for name, value in raw.items():
            if name not in DTYPES or not isinstance(value, number) or value <= 0:
                raise ValueError(
                    f"{where}: tflops {name!r}: each entry is a dtype ({', '.join(DTYPES)}) "
                    f"with a peak > 0, got {value!r}"
                )
            tflops[name] = float(value)
    machine = Machine(
        name=_require(data, "name", str, where),
        description=_require(data, "description", str, where),
        measured=_require(data, "measured", bool, where),
        source=_require(data, "source", str, where),
        gpu=_require(data, "gpu", str, where),
        gpus_per_node=_require(data, "gpus_per_node", int, where),
        nodes=_require(data, "nodes", int, where),
        sm_count=_require(data, "sm_count", int, where),
        copy_engines_per_gpu=_require(data, "copy_engines_per_gpu", int, where),
        hbm_gbs=float(_require(data, "hbm_gbs", number, where)),
        links=links,
        gather=gather,
        tflops=tflops,
    )
    if machine.gpus_per_node < 1 or machine.nodes < 1 or machine.sm_count < 1:
        raise ValueError(f"{where}: gpus_per_node, nodes and sm_count must be >= 1")
    if machine.nodes > 1 and "nic" not in links:
        raise ValueError(f"{where}: links: a machine of {machine.nodes} nodes needs a nic entry")
    return machine


def machine_names() -> list[str]:
    return sorted(p.stem for p in MACHINES_DIR.glob("*.json"))


def load_machine(name_or_path: str | Path) -> Machine:
    """A shipped description by name (``h200x2``) or a JSON file by path."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = MACHINES_DIR / f"{name_or_path}.json"
        if not path.is_file():
            raise ValueError(
                f"machine: no description named {str(name_or_path)!r}; shipped ones are "
                f"{', '.join(machine_names())}, or give a path to a JSON description"
            )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"machine: cannot read {path}: {err}") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"machine: {path} is not a JSON text file (byte {err.start} is not UTF-8)"
        ) from None
    return machine_from_dict(data, where=f"machine {path.name}")
