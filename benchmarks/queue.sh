#!/usr/bin/env bash
# The long study runs, in their pre-registered order, niced, one run at a time unless PARALLEL says more; resumable:
# run it again after any interruption and every finished run is skipped, a started one continues from its
# checkpoint. Pausing it
# (SIGSTOP/SIGCONT) is harmless: CPU time is counted per process, not by the clock.
#
#   setsid nohup bash benchmarks/queue.sh > queue.log 2>&1 &
#
# 1. agents: Adam against IMPALA's learner on the control (learner.toml), then Adam made stable: its pilot
#    (learner-adam-pilot.toml) and its comparison against learner.toml's Adam runs (learner-stable.toml), which
#    decides the learner of the reach study;
# 2. speech: the transformers' learning-rate sweep (lr-sweep.toml, and lr-sweep-extra.toml where the rule asks);
# 3. agents: the reach study with the decided learner (reach-stable.toml or reach-adam.toml), then
# 4. speech: the three arms at their tuned rates (tuned.toml, 5 seeds, more where the rule asks) and their comparison.
# PARALLEL=N runs N runs at a time (one thread each; CPU seconds are counted per process, so results and costs do
# not depend on it). With COMMIT=1, each stage's results are committed under its study's name as it finishes (paths
# given explicitly, so nothing else in the work tree is committed).
set -euo pipefail
shopt -s nullglob  # a stage without a cost pilot or a plot commits the rest
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
NICE=(nice -n 19)
STUDY=("${NICE[@]}" "$PY" -m compressive_transformer.cli study)

commit() {  # commit MESSAGE PATH... (only with COMMIT=1; a failure to commit never stops the queue)
    [ "${COMMIT:-0}" = 1 ] || return 0
    local message=$1
    shift
    git add -f -- "$@" 2>/dev/null && git commit -q -m "$message" -- "$@" || true
}

agents() {  # agents SPEC: train every run, then commit the results and each finished run's record
    local spec=$1 name
    name=$(basename "$spec" .toml)
    "${NICE[@]}" "$PY" -m benchmarks.agents.run "benchmarks/agents/$spec" --parallel "${PARALLEL:-1}"
    commit "agents $name: results (metrics.jsonl.gz, config and CPU record of every run)" \
        "benchmarks/agents/$name"/results.* "benchmarks/agents/$name"/success.png "benchmarks/agents/$name"/cost.* \
        "benchmarks/agents/$name"/runs/*/{config.toml,cpu_seconds.jsonl,metrics.jsonl.gz}
}

swept() {  # swept NAME: the sweep's committed report says every run finished (it is not run, nor reported, again)
    git ls-files --error-unmatch "benchmarks/speech/$1/results.md" > /dev/null 2>&1 &&
        grep -Eq '\*\*([0-9]+) of \1 runs finished\*\*' "benchmarks/speech/$1/results.md"
}

speech() {  # speech SPEC OUT
    "${STUDY[@]}" "benchmarks/speech/$1" --out "benchmarks/speech/$2" --parallel "${PARALLEL:-1}" --threads "${PARALLEL:-1}"  # --threads is the total: one each
    commit "speech $2: results" "benchmarks/speech/$2/results" "benchmarks/speech/$2"/results.* \
        "benchmarks/speech/$2"/*.png "benchmarks/speech/$2"/cost.* "benchmarks/speech/$1"
}

[ -f benchmarks/agents/learner/cost.json ] || "${NICE[@]}" "$PY" -m benchmarks.agents.cost \
    benchmarks/agents/learner.toml --models txl-adam txl-impala ct4-adam ct4-impala --out benchmarks/agents/learner
finished() {  # finished NAME: the study's runs are all done and committed (its report is not rewritten)
    git ls-files --error-unmatch "benchmarks/agents/$1/results.json" > /dev/null 2>&1 &&
        "$PY" -m benchmarks.agents.run "benchmarks/agents/$1.toml" --check-finished > /dev/null 2>&1
}
finished learner || agents learner.toml
finished learner-adam-pilot || agents learner-adam-pilot.toml
finished learner-stable || agents learner-stable.toml

swept lr-sweep || speech lr-sweep.toml lr-sweep
if "$PY" -m benchmarks.speech.tune extra | grep -q 'lr-sweep-extra.toml$'; then
    swept lr-sweep-extra || speech lr-sweep-extra.toml lr-sweep-extra
fi

# The reach study's learner, by "Adam made stable"'s rule (3): the stable learner only if its runs stay solved more
# often (one-sided Fisher p < 0.05) with no more drops in all than Adam's.
reach=$("$PY" - <<'PY'
import json
pooled = json.load(open("benchmarks/agents/learner-stable/results.json"))["pooled"][0]
decided = pooled["p_fisher"] is not None and pooled["p_fisher"] < 0.05 and pooled["drops"][0] <= pooled["drops"][1]
print("reach-stable" if decided else "reach-adam")
PY
)
echo "the reach study's learner: $reach"
[ -f "benchmarks/agents/$reach/cost.json" ] || "${NICE[@]}" "$PY" -m benchmarks.agents.cost \
    "benchmarks/agents/$reach.toml" --out "benchmarks/agents/$reach"
agents "$reach.toml"

[ -f benchmarks/speech/tuned.toml ] || "$PY" -m benchmarks.speech.tune tuned
[ -f benchmarks/speech/tuned/cost.json ] || "${NICE[@]}" "$PY" -m benchmarks.speech.cost \
    benchmarks/speech/tuned.toml --updates 20 60 --out benchmarks/speech/tuned
speech tuned.toml tuned
"$PY" -m benchmarks.speech.tune seeds
speech tuned.toml tuned  # the added seeds, if the rule asked for any (nothing to do otherwise)
"$PY" -m benchmarks.speech.compare benchmarks/speech/tuned --design tuned --split test
commit "speech tuned: judged comparisons" benchmarks/speech/tuned/comparisons.*
echo "queue finished"
