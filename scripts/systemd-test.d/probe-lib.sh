# The probes' shared helpers (probe.sh, package-probe.sh), sourced inside the
# container. The sourcing probe sets RESULTS (one line per check) first.

now_ms() { date +%s%3N; }
# secs FROM_MS TO_MS: the interval in seconds, two decimals.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b - a) / 1000 }'; }
# lt A B: A < B, as decimals.
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }
log() { echo "[$(date +%T.%3N)] $*"; }
pass() { local n=$1; shift; echo "ok   $n  $*" >>"$RESULTS"; log "ok $n: $*"; }
fail() {
  local n=$1; shift
  echo "FAIL $n  $*" >>"$RESULTS"
  log "FAIL $n: $*"
  exit 1
}
# fail_later N MSG: a failed check that leaves the rest meaningful: recorded,
# the run goes on, and the probe exits 1 at the end.
failed_later=0
fail_later() {
  local n=$1; shift
  echo "FAIL $n  $*" >>"$RESULTS"
  log "FAIL $n: $*"
  failed_later=1
}
prop() { systemctl show -P "$2" "$1"; }
# journal_has UNIT TEXT: the unit's journal of this boot has TEXT (read in
# full: grep -q on a pipe would make journalctl fail with SIGPIPE).
journal_has() { grep -qF -- "$2" <<<"$(journalctl -b --no-pager -u "$1")"; }
journal_count() { grep -cF -- "$2" <<<"$(journalctl -b --no-pager -u "$1")"; }
# wait_until SECONDS CMD...: polls CMD every 0.2 s; false when time runs out.
wait_until() {
  local deadline=$(($(now_ms) + $1 * 1000)); shift
  until "$@"; do
    [ "$(now_ms)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}
active_with_new_pid() { # UNIT OLD_PID
  [ "$(prop "$1" ActiveState)" = active ] && local p && p=$(prop "$1" MainPID) \
    && [ "$p" != 0 ] && [ "$p" != "$2" ]
}
not_running_pid() { # UNIT PID: the unit left active/running, or its main pid changed
  [ "$(prop "$1" SubState)" != running ] || [ "$(prop "$1" MainPID)" != "$2" ]
}
# nofile UNIT: checks the unit's LimitNOFILE=65536 on its main process and
# prints what it has. Where the machine cannot raise a hard limit that far
# (no CAP_SYS_RESOURCE, as in some sandboxes: the container's init keeps
# the host's hard limit), systemd sets the closest it can, init's hard
# limit; that is accepted and said. False otherwise.
nofile() {
  local unit=$1 want=65536 pid init_hard soft hard expect
  [ "$(prop "$unit" LimitNOFILE)" = "$want" ] || { echo "LimitNOFILE is $(prop "$unit" LimitNOFILE)"; return 1; }
  pid=$(prop "$unit" MainPID)
  init_hard=$(awk '/^Max open files/ { print $5 }' /proc/1/limits)
  read -r soft hard < <(awk '/^Max open files/ { print $4, $5 }' "/proc/$pid/limits")
  expect=$want
  [ "$init_hard" != unlimited ] && [ "$init_hard" -lt "$want" ] && expect=$init_hard
  if [ "$soft" != "$expect" ] || [ "$hard" != "$expect" ]; then
    echo "the daemon's descriptor limits are $soft/$hard, expected $expect"
    return 1
  fi
  if [ "$expect" = "$want" ]; then
    echo "$want descriptors"
  else
    echo "$soft descriptors (LimitNOFILE=$want, clamped to this machine's hard limit $init_hard)"
  fi
}
