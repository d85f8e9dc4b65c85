"""Step 1 (capture_reference.py): upstream generate() run for real, its three graphs' I/O recorded.

Modules:
    generation  the generate() requests the pipeline issues (auto, design, clone, batch); WAV I/O
    capture     record real generate() I/O; the capture's files, paths, manifest and the rows read back
"""
