"""Notebook 09's parameters (GPUs for an SLO). Checked on construction, so a bad value stops the notebook in its second
cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import KvlabError, ParameterError
from ..serving.plan import parse_slo
from ..serving.study import Deployment, Study
from ..sim.traces import load_trace
from .params import NotebookParams


@dataclass
class ServingParams(NotebookParams):
    """Notebook 09's parameters, checked on construction."""

    trace: str  # 'synthetic', a trace path, or a public trace by name
    synthetic_sessions: int  # sessions in the synthetic agent workload at load 1
    human_pause_median_s: float  # median pause of a synthetic session for a human reply, seconds
    seed: int  # seed of the synthetic workload
    limit: int  # read at most this many requests of a trace file (0: all)
    gpu: str  # GPU of every deployment
    engine: str  # scheduler and allocation rule
    step_time: str  # step-time source of every deployment
    deployments: list  # 'MODEL[:KV_FORMAT][@tpN]' strings
    slo: dict  # metric -> seconds, e.g. {"ttft_p99": 2.0, "tpot_p99": 0.05} (or the CLI's 'metric=seconds,...')
    load: float  # offered load of the GPU plan, x the trace's
    loads: list  # offered loads of the knee curve
    knee: list  # deployments (indices into `deployments`) drawn on the knee curve
    dram_gbs: list  # host-DRAM tier sizes per replica for the tier comparison, GB (0: HBM only)
    max_replicas: int  # the plan gives up past this many replicas
    steady: bool  # ask aiconfigurator's steady-state recommend beside each plan it covers (kvlab.serving.steady)
    parsed: list = field(init=False)  # Deployment per entry of `deployments`
    slo_limits: dict = field(init=False)  # the SLO checked: metric -> seconds
    slo_text: str = field(init=False)  # the SLO as the CLI writes it

    def __post_init__(self):
        from ..engines import ENGINES
        from ..hardware import get_gpu
        from ..models import load_model
        from ..serving.stepsources import catalog_names
        self.need_text("trace")
        self.need_int("synthetic_sessions")
        self.need_number("human_pause_median_s", 0.0, lo_open=True)
        self.need_int("seed", 0)
        self.need_int("limit", 0)
        self.need_lookup("gpu", get_gpu)
        self.need_choice("engine", ENGINES)
        self.need_choice("step_time", catalog_names())
        self.parsed = []
        for text in self.need_names("deployments"):
            try:
                d = Deployment.parse(text)
                load_model(d.model)
                if d.kv_format is not None:
                    from ..formats import get_format
                    get_format(d.kv_format)
                from ..serving.parallel import Parallelism
                from ..serving.simulator import replica_capacity  # its weights leave room for KV on this GPU at this TP
                replica_capacity(d.model, self.gpu, Parallelism(tp=d.tp), self.engine, d.kv_format)
            except KvlabError as e:
                raise ParameterError(f"parameter deployments: {e}") from None
            self.parsed.append(d)
        text = self.slo
        if isinstance(self.slo, dict):
            text = ",".join(f"{k}={v!r}" for k, v in self.slo.items()) or " "
            bad = [v for v in self.slo.values() if isinstance(v, bool) or not isinstance(v, (int, float))]
            if bad:
                raise ParameterError(f"parameter slo: {bad[0]!r} is not a number of seconds")
        try:
            self.slo_limits = parse_slo(text)
            self.slo_text = ",".join(f"{k}={v:g}" for k, v in self.slo_limits.items())
        except KvlabError as e:
            raise ParameterError(f"parameter slo: {e}") from None
        self.need_number("load", 0.0, lo_open=True)
        self.need_numbers("loads", 0.0, lo_open=True)
        for i in self.need_list("knee"):
            self.need_int("knee", 0, len(self.parsed) - 1, value=i)
        self.need_numbers("dram_gbs", 0.0)
        self.need_int("max_replicas")
        self.need_flag("steady")

    @property
    def synthetic(self) -> dict | None:
        """The synthetic workload's knobs (Study's `synthetic`), or None for a trace file."""
        if self.trace != "synthetic":
            return None
        return dict(sessions=self.synthetic_sessions, seed=self.seed, human_pause_median_s=self.human_pause_median_s)

    def plan_command(self, d: Deployment) -> str:
        """The `kvlab plan` command that answers the GPUs-needed question for deployment `d` from the shell: the same
        trace at the same load, step times, SLO and replica limit, with the TP fixed to the deployment's (the shell
        also searches TP when --tp is left out)."""
        import shlex
        parts = ["kvlab plan", shlex.quote(self.trace)]
        if self.synthetic is not None:
            parts += ["--sessions", str(self.synthetic_sessions), "--human-pause-s", f"{self.human_pause_median_s:g}",
                      "--seed", str(self.seed)]
        elif self.limit:
            parts += ["--limit", str(self.limit)]
        parts += ["--load", f"{self.load:g}", "--model", shlex.quote(d.model), "--gpu", self.gpu, "--engine",
                  self.engine, "--tp", str(d.tp)] + (["--kv-format", d.kv_format] if d.kv_format else [])
        return " ".join(parts + ["--step-time", self.step_time, "--slo", self.slo_text, "--max-replicas",
                                 str(self.max_replicas), "--no-steady"])

    def study(self) -> Study:
        """The study these parameters describe (its trace loaded: a bad path or name stops here, named)."""
        if self.synthetic is not None:
            tr = load_trace("synthetic", **self.synthetic)
        else:
            try:
                tr = load_trace(self.trace, limit=self.limit or None)
            except KvlabError as e:
                raise ParameterError(f"parameter trace: {e}") from None
        return Study(tr, self.gpu, self.engine, self.step_time, synthetic=self.synthetic)
