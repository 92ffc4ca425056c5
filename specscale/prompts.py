"""Prompt and step-format constants, and the generator's chat, shared by the tasks, the trainers, the
verifiers, the search runtime and the server (each is defined here only).

- ``PRM_SYSTEM_PROMPT``: Qwen2.5-Math-PRM's system prompt, verbatim (model card; docs/design.md, "PRM formats").
- ``PRM_STEP_TAG``: the PRM's step separator token ``<extra_0>``.
- ``STEP_SEPARATOR``: ``"\\n\\n"``, the end of a reasoning step in generated text.
- ``TOY_GENERATOR_SYSTEM_PROMPT``: the system prompt the bundled toy generator was trained with.
- ``MATH_SYSTEM_PROMPT``: huggingface/search-and-learn's generator system prompt (its ``Config.system_prompt``,
  the same for Qwen2.5 and Llama-3.x generators), used by ``specscale eval`` on real data sets.
- ``chat_messages``: the conversation a generator is prompted with for one question; apply the chat
  template to it with ``add_generation_prompt=True``.
"""

PRM_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
PRM_STEP_TAG = "<extra_0>"
STEP_SEPARATOR = "\n\n"
TOY_GENERATOR_SYSTEM_PROMPT = "Solve the problem step by step. Put the final answer in \\boxed{}."
MATH_SYSTEM_PROMPT = (
    "Solve the following math problem efficiently and clearly:\n\n"
    "- For simple problems (2 steps or fewer):\nProvide a concise solution with minimal explanation.\n\n"
    "- For complex problems (3 steps or more):\nUse this step-by-step format:\n\n"
    "## Step 1: [Concise description]\n[Brief explanation and calculations]\n\n"
    "## Step 2: [Concise description]\n[Brief explanation and calculations]\n\n"
    "...\n\n"
    "Regardless of the approach, always conclude with:\n\n"
    "Therefore, the final answer is: $\\boxed{answer}$. I hope it is correct.\n\n"
    "Where [answer] is just the final number or expression that solves the problem."
)


def chat_messages(question: str, system_prompt: str | None = TOY_GENERATOR_SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The system prompt (none when None) then the question as the user's turn."""
    system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    return [*system, {"role": "user", "content": question}]
