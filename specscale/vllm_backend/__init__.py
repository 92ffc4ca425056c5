"""SpecScale's search on vLLM's V1 engine, behind the typed backend seam (runtime/backend.py; issue 47).

- `engine_args.py`: the `--vllm-arg` pass-through, the lazy import of vLLM and the one-line errors;
- `engine_client.py` `VllmEngineClient`: vLLM's `LLMEngine` in this process (add, abort, step, its block pool);
- `sequence.py` `VllmSequence`, `SegmentRules`: a sequence as the backend holds it and when its segment ends;
- `generator.py` `VllmGenerator`: the `GeneratorBackend` (every `SequenceOp` as vLLM requests);
- `verifier.py` `VllmVerifier`: the `VerifierBackend` over vLLM's pooling path;
- `stack.py` `VllmPipelineConfig` / `VllmStack`: the description `composition.py` `build_stack` builds.

Nothing here imports vLLM at module level: `specscale` imports without it (docs/gpu.md, docs/design.md,
"vLLM backend").
"""
