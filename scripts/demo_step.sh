#!/usr/bin/env bash
# One step of `make demo`, quietly: the step's whole output is appended to LOG (with the command
# line), and only its summary reaches the terminal — the lines that are not per-call checks,
# exporter chatter or progress bars. A failed step prints its last 30 lines and where the log is,
# and exits with the step's own status, so make stops there (and .DELETE_ON_ERROR drops the target).
#
#   scripts/demo_step.sh LOG TITLE COMMAND [ARG...]
set -uo pipefail
log=$1 title=$2
shift 2
mkdir -p "$(dirname "$log")"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "== $title"
printf '\n$ %s\n' "$*" >> "$log"
started=$SECONDS
"$@" > "$out" 2>&1
rc=$?
cat "$out" >> "$log"
if [ $rc -ne 0 ]; then
    tail -n 30 "$out"
    echo "== $title FAILED (exit $rc after $((SECONDS - started)) s); whole output: $log"
    exit $rc
fi
# Per-call check lines ("[transformer] clone step 3 ..."), torch.onnx's progress, tqdm bars and
# blank lines stay in the log; the step's own "[step N]" lines, tables and verdicts are shown.
grep -avE '^\[(transformer|encoder|decoder|end_to_end|runtime|torch\.onnx)\]|steps?:|^[[:space:]]*$' "$out"
echo "   ($((SECONDS - started)) s; details in $log)"
