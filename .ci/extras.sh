#!/usr/bin/env bash
# Each extra installed alone, as the README's lines say: a fresh environment per extra with
# torch, the project and that extra only (no test extra, no other extra to hide a missing
# dependency), then that extra's smoke (.ci/extra_smoke.py). Usage: bash .ci/extras.sh [EXTRA...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
extras=("$@")
[[ ${#extras[@]} -gt 0 ]] || extras=(mujoco atari envpool video mlflow notebook graph sweep bench)
for extra in "${extras[@]}"; do
  started=$SECONDS
  work=$(mktemp -d "${TMPDIR:-/tmp}/daskrl-extra-$extra.XXXX")
  python -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q torch==2.13.0
  "$work/venv/bin/python" -m pip install -q -e ".[$extra]"
  (cd "$work" && "$work/venv/bin/python" "$root/.ci/extra_smoke.py" "$extra" "$root")
  echo "extra $extra: installed alone, smoke passed ($((SECONDS - started)) s)"
  rm -rf "$work"
done
