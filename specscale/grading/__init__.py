"""Grading on real math data sets: the bundled test sets and their gold answers (`datasets`), a
solution's final answer (`extract`), and answer equivalence with math-verify under a timeout that works
from any thread (`equivalence`, `worker`)."""

from specscale.grading.datasets import DATASETS, Problem, load_problems
from specscale.grading.equivalence import AnswerGrader, GraderStats, shared_grader
from specscale.grading.extract import extract_answer

__all__ = ["DATASETS", "AnswerGrader", "GraderStats", "Problem", "extract_answer", "load_problems", "shared_grader"]
