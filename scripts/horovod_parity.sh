#!/usr/bin/env bash
# Horovod's own parallel tests against horovod_ext: each test file is run twice under horovodrun -np 2 --gloo, as
# Horovod ships it and with its `import horovod.<framework> as hvd` swapped for horovod_ext's, and the outcomes are
# compared test by test (every test that passes on plain Horovod must pass on ours). The tests are read from a
# Horovod source checkout (HOROVOD_SRC, default: the v0.28.1 tag of a git clone there) into a scratch folder; none
# is copied into this project. Run from an environment set up by scripts/setup.sh: mock and parameterized (Horovod's
# tests import them) and pytest-timeout are installed into it; a rank whose test hangs past TEST_TIMEOUT seconds
# (default 180) is ended with its stacks printed, and that file then has no result, which counts as a regression.
#
#   HOROVOD_SRC=/path/to/horovod bash scripts/horovod_parity.sh      # prints the comparison, exits 1 on a regression
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC=${HOROVOD_SRC:?set HOROVOD_SRC to a git checkout of horovod/horovod}
REF=${HOROVOD_REF:-v0.28.1}
WORK=$(mktemp -d)
python -m pip install -q mock parameterized pytest-timeout
declare -A SWAP=([test_torch]="horovod.torch" [test_tensorflow2_keras]="horovod.tensorflow.keras")
for variant in plain swapped; do
  mkdir -p "$WORK/$variant/parallel" "$WORK/$variant/utils"
  git -C "$SRC" show "$REF:test/utils/common.py" >"$WORK/$variant/utils/common.py"
  for t in "${!SWAP[@]}"; do
    git -C "$SRC" show "$REF:test/parallel/$t.py" >"$WORK/$variant/parallel/$t.py"
    if [ "$variant" = swapped ]; then
      module=${SWAP[$t]}
      sed -i "s/^import $module as hvd\$/import horovod_ext.${module#horovod.} as hvd/" "$WORK/$variant/parallel/$t.py"
      grep -q "^import horovod_ext\." "$WORK/$variant/parallel/$t.py"  # the swap applied
    fi
    (cd "$WORK/$variant/parallel" && PYTHONPATH="$ROOT" OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=3 timeout 1500 \
      horovodrun -np 2 -H localhost:2 --gloo bash -c "python -m pytest -q -p no:cacheprovider --timeout ${TEST_TIMEOUT:-180} --timeout-method thread $t.py \
      --junitxml=$WORK/${variant}_${t}_\${HOROVOD_RANK}.xml" >"$WORK/${variant}_$t.log" 2>&1) || true
  done
done
python - "$WORK" "${!SWAP[@]}" <<'COMPARE'
import os, sys
import xml.etree.ElementTree as ET

work, tests = sys.argv[1], sys.argv[2:]


def outcomes(path):
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        out[case.get("name")] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds \
            else "passed"
    return out


regressions = 0
for test in tests:
    for rank in (0, 1):
        paths = [os.path.join(work, f"{v}_{test}_{rank}.xml") for v in ("plain", "swapped")]
        if not all(os.path.exists(p) for p in paths):
            print(f"{test} rank {rank}: no result (see {work}/*_{test}.log)")
            regressions += 1
            continue
        plain, ours = map(outcomes, paths)
        lost = sorted(n for n, s in plain.items() if s == "passed" and ours.get(n) != "passed")
        gained = sorted(n for n, s in ours.items() if s == "passed" and plain.get(n) != "passed")
        count = lambda o: sum(s == "passed" for s in o.values())
        print(f"{test} rank {rank}: {len(plain)} tests; passed on Horovod {count(plain)}, on horovod_ext "
              f"{count(ours)}; passed on Horovod only: {lost or 'none'}; on horovod_ext only: {gained or 'none'}")
        regressions += len(lost)
sys.exit(1 if regressions else 0)
COMPARE
