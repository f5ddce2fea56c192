"""The front of the embedded server: HTTP routes, request schemas, errors, OpenAI shaping, detokenization, flags.

It mirrors SGLang's `entrypoints/` (+ TokenizerManager/DetokenizerManager); the model, batching, speculation and
sampling live in `workflow_scripts.engine` (SGLang's `managers/scheduler` + `model_executor/`).
"""
