"""Prompt and step-format constants shared by the tasks, the trainers and the verifiers.

- ``PRM_SYSTEM_PROMPT``: Qwen2.5-Math-PRM's system prompt, verbatim (model card, FORMATS.md section 1).
- ``PRM_STEP_TAG``: the PRM's step separator token ``<extra_0>``.
- ``STEP_SEPARATOR``: ``"\\n\\n"``, the end of a reasoning step in generated text.
- ``TOY_GENERATOR_SYSTEM_PROMPT``: the system prompt the bundled toy generator was trained with.
"""

PRM_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
PRM_STEP_TAG = "<extra_0>"
STEP_SEPARATOR = "\n\n"
TOY_GENERATOR_SYSTEM_PROMPT = "Solve the problem step by step. Put the final answer in \\boxed{}."
