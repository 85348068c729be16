"""A small builder for linear programs solved with HiGHS (``highspy``); no hand-written solver."""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np

INF = float("inf")


class LPError(RuntimeError):
    """HiGHS did not return an optimal solution."""


class LP:
    """Columns and rows added by index; ``solve()`` maximizes (or minimizes) and returns the values."""

    def __init__(self, maximize: bool = True, solver: str = "ipm", time_limit_s: float = INF, max_nodes: int = 0):
        self.maximize = maximize
        self.solver = solver
        # A MILP (any integer column) stopped at one of these limits returns its best integral
        # solution, and ``status`` says which limit; ``gap`` is HiGHS's relative MIP gap. The node
        # limit (0: none) stops it at the same point on any machine; the time limit does not.
        self.time_limit_s, self.max_nodes = time_limit_s, max_nodes
        self.integer: list[bool] = []
        self.gap = 0.0
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.cost: list[float] = []
        self.names: list[str] = []
        self.row_lo: list[float] = []
        self.row_hi: list[float] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.solve_s = 0.0
        self.status = ""

    def var(self, lo: float = 0.0, hi: float = INF, cost: float = 0.0, name: str = "", integer: bool = False) -> int:
        self.integer.append(integer)
        self.lo.append(lo)
        self.hi.append(hi)
        self.cost.append(cost)
        self.names.append(name)
        return len(self.lo) - 1

    def row(self, terms: Iterable[tuple[int, float]], lo: float = -INF, hi: float = INF) -> int:
        r = len(self.row_lo)
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        for c, v in terms:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        return r

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.row_lo), len(self.lo)

    def solve(self) -> np.ndarray:
        import highspy

        n, m = len(self.lo), len(self.row_lo)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, m
        lp.col_cost_ = np.asarray(self.cost, dtype=float)
        lp.col_lower_ = np.asarray(self.lo, dtype=float)
        lp.col_upper_ = np.asarray(self.hi, dtype=float)
        lp.row_lower_ = np.asarray(self.row_lo, dtype=float)
        lp.row_upper_ = np.asarray(self.row_hi, dtype=float)
        lp.sense_ = highspy.ObjSense.kMaximize if self.maximize else highspy.ObjSense.kMinimize
        cols = np.asarray(self.cols, dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        counts = np.bincount(cols, minlength=n)
        start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = np.asarray(self.rows, dtype=np.int32)[order]
        lp.a_matrix_.value_ = np.asarray(self.vals, dtype=float)[order]
        mip = any(self.integer)
        if mip:
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in self.integer]
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        if not mip:
            h.setOptionValue("solver", self.solver)  # interior point + crossover: a vertex, 2-4x faster here
        if self.time_limit_s < INF:
            h.setOptionValue("time_limit", float(self.time_limit_s))
        if mip and self.max_nodes:
            h.setOptionValue("mip_max_nodes", int(self.max_nodes))
        h.passModel(lp)
        t0 = time.perf_counter()
        h.run()
        self.solve_s = time.perf_counter() - t0
        status = h.getModelStatus()
        self.status = h.modelStatusToString(status)
        stopped = mip and status != highspy.HighsModelStatus.kInfeasible and h.getInfo().primal_solution_status == 2
        if status != highspy.HighsModelStatus.kOptimal and not stopped:
            raise LPError(f"the linear program is not solvable: HiGHS reports {self.status!r}")
        if mip:
            self.gap = float(h.getInfo().mip_gap)
        return np.asarray(h.getSolution().col_value, dtype=float)
