"""The conformance vectors: fixed generate() cases written as JSON traces that a port (C#, Node,
mobile) replays stage by stage, and the replay that checks a folder of them on this runtime.

    format   what every vector shares: the format name, the audio summary, the folder's README
    cases    the fixed cases and the reference files they read
    record   the runtime's run of each case as a vector (write_vectors), and the replay (check_vectors)
    compare  a replay against a stored vector: the order, exact or within the envelope tolerance
    rules    the "rules" vector: host rules a port could read two ways, no graph run

The command line that writes and replays a folder is the CLI's (omnivoice_onnx.cli.vectors); no
module here imports a front end. The format as a port reads it: docs/vectors.md.
"""
