"""A calibrated cost model: any schedule's time predicted from its plan, on any machine described.

``machine``   machine descriptions as data (``machines/*.json``: measured, or vendor figures)
``gather``    embedding pooling's gather bandwidth, fitted on one H100 (descriptions derive it)
``params``    the calibrated parameters and their JSON file (``schedules/<machine>/model.json``)
``simulate``  a list scheduler over one rank's tasks with contention between lanes
``costs``     per-task costs (GEMM roofline + measured correction, alpha-beta links, rings)
``predict``   a schedule's time, every schedule of a problem, the predicted winner
``calibrate`` fitting the parameters on a profile store (numpy/scipy; never on predict's path)

Pure Python on the prediction path: no torch, Triton, numpy or scikit-learn.
"""

from ficco.model.machine import Link, Machine, load_machine, machine_names
from ficco.model.params import ModelParams, load_params, params_from_dict
from ficco.model.predict import (
    SHIPPED_PARAMS,
    Prediction,
    Predictor,
    ScheduleTime,
    graphed,
    predict_problem,
    predictor,
)
from ficco.model.simulate import SimResult, SimTask, simulate

__all__ = [
    "SHIPPED_PARAMS",
    "Link",
    "Machine",
    "ModelParams",
    "Prediction",
    "Predictor",
    "ScheduleTime",
    "SimResult",
    "SimTask",
    "graphed",
    "load_machine",
    "load_params",
    "machine_names",
    "params_from_dict",
    "predict_problem",
    "predictor",
    "simulate",
]
