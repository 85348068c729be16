"""Flow-level analysis and planning beside the packet simulator (docs/analysis.md).

* ``flow_model``: one PS job's common rate, aggregation placement, switch/PS aggregation rates
  and link loads for Geryon-like routing, ATP, SwitchML and GRID.
* ``grid``: the GRIA LP (HiGHS), R-GRIA rounding and the routing policy.
* ``rina``: Rina's bandwidth-occupation model, ring dependency-chain model and incremental planner.
* ``scenario``: the ``inalab analyze`` scenario schema, the reading of a simulate scenario for the
  flow model, the catalogue of shipped scenarios and :func:`analyze`.
"""
from __future__ import annotations

from .flow_model import FlowResult, Problem
from .models import SCHEMES
from .scenario import Analysis, AnalysisScenario, FlowModelNote, analyze, load_analysis, shipped_analyses

__all__ = ["SCHEMES", "FlowResult", "Problem", "Analysis", "AnalysisScenario", "FlowModelNote", "analyze",
           "load_analysis", "shipped_analyses"]
