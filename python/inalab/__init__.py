"""inalab: simulate in-network aggregation (INA) for distributed ML training.

    >>> import inalab
    >>> result = inalab.simulate("demo")          # a shipped scenario, a TOML path, a dict or a Scenario
    >>> result.jobs[["name", "scheme", "jct_s"]]
    >>> result.summary()

The packet-level simulator is the Rust extension ``inalab._core``; this package validates
scenarios (``inalab.config``), runs them and returns DataFrames (``inalab.results``).
"""
from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version as _dist_version
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Union

from .errors import ConfigError
from .results import Result

if TYPE_CHECKING:
    from .capture import Capture
    from .config import Scenario

__all__ = [
    "simulate", "analyze", "load_scenario", "Scenario", "Result", "ConfigError", "__version__",
    "Switch", "ParameterServer", "Client", "TensorContext", "quantization_bound", "emulate", "compare", "sweep",
    "nccl_plugin_path",
]

NCCL_PLUGIN = "libnccl-net-inalab.so"


def nccl_plugin_path() -> Path:
    """Where the NCCL network plugin (``libnccl-net-inalab.so``) is: set ``NCCL_NET_PLUGIN`` to
    it, with ``NCCL_COLLNET_ENABLE=1`` and ``INALAB_SWITCH``, and NCCL's allreduces go through
    the switch (docs/runtime.md, "PyTorch on GPUs through NCCL"). Raises FileNotFoundError,
    saying how to build it, where it is missing (a source tree before ``make build``)."""
    path = Path(__file__).resolve().parent / NCCL_PLUGIN
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: `make build` builds it (cargo build --release -p inalab-nccl), "
                                "and a wheel from `make wheel` ships it")
    return path

try:
    __version__ = _dist_version("inalab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

ProgressFn = Callable[[float, int], None]


def __getattr__(name: str):
    # inalab.config is imported on first use, so that `python -m inalab.config` runs it fresh.
    if name in ("load_scenario", "Scenario"):
        from . import config

        return getattr(config, name)
    if name == "emulate":
        from .emulation import emulate

        return emulate
    if name == "sweep":
        from .sweeps import sweep

        return sweep
    if name == "compare":
        from .comparison import compare

        return compare
    if name in ("Switch", "ParameterServer", "Client", "TensorContext", "quantization_bound"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'inalab' has no attribute {name!r}")


def simulate(
    config: Union[str, Path, dict, "Scenario"],
    *,
    seed: Optional[int] = None,
    progress: Union[bool, ProgressFn] = False,
    pcap: Optional["Capture"] = None,
) -> Result:
    """Validates ``config``, simulates it and returns the :class:`Result`.

    ``seed`` overrides the scenario's seed. ``progress=True`` shows progress on stderr for runs
    longer than a second (a bar on a terminal, a line every few seconds otherwise); a callable
    gets ``(fraction_done, events)`` about every 0.1 s. ``pcap``
    (:class:`inalab.capture.Capture`) writes pcapng captures of the simulated traffic;
    ``result.captures`` lists the files. Raises :class:`ConfigError` for an invalid scenario,
    before anything is simulated. A run whose jobs failed or did not finish still returns its
    result: check ``result.ok`` / ``result.outcome`` and ``result.problems()``.

    Ctrl-C stops the run within a fraction of a second: the ``KeyboardInterrupt`` (or whatever
    a signal handler or ``progress`` raised) propagates with ``.result``, the :class:`Result`
    of what was simulated until then (``outcome == "interrupted"``).
    """
    from . import _core
    from .config import load_scenario

    scenario = load_scenario(config)
    if seed is not None:
        scenario = scenario.model_copy(update={"seed": seed})
    spec = scenario.to_spec()
    if pcap is not None:
        spec["capture"] = pcap.to_spec()
    spec = json.dumps(spec)
    if progress is True:
        from .progress import ProgressBar

        with ProgressBar(scenario.name) as bar:
            return _run(_core, spec, bar.update)
    user = progress or None
    return _run(_core, spec, None if user is None else (lambda fraction, events, _sim_time_s: user(fraction, events)))


def _run(core, spec: str, progress: Optional[Callable[[float, int, float], None]]) -> Result:
    from .config import rust_error

    try:
        result = Result.from_json(core.simulate(spec, progress))
    except BaseException as e:
        partial = getattr(e, "inalab_result", None)
        if partial is not None:  # stopped by Ctrl-C, a signal handler or the progress callback
            e.result = Result.from_json(partial)
            raise
        if isinstance(e, ValueError):
            # The simulator's own validation; inalab.config should have caught it first.
            raise rust_error(e) from None
        raise
    if result.raw.get("capture_error"):
        # The run itself finished; what it could not write must not pass unnoticed.
        raise OSError(result.raw["capture_error"])
    return result


def analyze(config, *, seed: Optional[int] = None, schemes: Optional[list] = None, job: Optional[str] = None,
            notes: Optional[list] = None):
    """Flow-level analysis of a scenario in either format (TOML path, shipped name such as
    ``"grid-fig1"`` or ``"emulate-grid-fig1"``, TOML text, dict or Scenario): an analysis
    scenario, or a simulate scenario whose job with a parameter server is analysed (``job``
    names it where several have one). Returns an :class:`inalab.analysis.Analysis` whose
    ``summary``, ``workers``, ``switches`` and ``links`` are DataFrames; ``notes`` (a list, also
    in ``Analysis.notes``) receives what the flow model did not use of a simulate scenario,
    issued as ``inalab.analysis.FlowModelNote`` warnings when no list is given. See docs/analysis.md."""
    from .analysis import analyze as _analyze

    return _analyze(config, seed=seed, schemes=schemes, job=job, notes=notes)
