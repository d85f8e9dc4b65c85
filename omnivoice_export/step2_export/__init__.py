"""Step 2 (export_omnivoice.py): the three fp32 ONNX graphs, the files beside them and their report.

Modules:
    wrappers        the three exportable nn.Modules
    exporting       torch -> ONNX, sidecar consolidation, metadata, self-checks
    report          export-report.json: its schema, integrity checks, atomic merges (every later step writes here)
    model_card      the bundle's README.md (model card) and the licences it inherits
    runtime_assets  the files the torch-free runtime reads beside the graphs (tokenizer, runtime config)
    ort_runtime     the ONNX graphs as drop-in modules of upstream generate() (steps 4 and 6 run them)
"""
