"""The batch job (`omnivoice-onnx batch`): upstream's JSONL test list in, one WAV per line and a
results.jsonl out, each line exact whatever the engine, the worker count, the order or a resume.

    run         the driver: checks every line, plans, hands the tasks to an engine, writes every
                file (run_batch, Options); the worker a process or an actor holds (Synthesizer)
    lines       the list's format, read and checked line by line; seeds, request hashes, estimates
    pool        the local engine: N spawned processes, each with one model
    ray_engine  the Ray Data engine (`--ray`, the `ray` extra), imported only when asked for

The engines know nothing of the model: the driver hands them what builds a worker. Nothing is
re-exported here: callers name the module (`from omnivoice_onnx.batch.run import run_batch`).
"""
