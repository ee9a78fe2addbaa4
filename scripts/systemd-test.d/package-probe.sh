#!/bin/bash
# scripts/systemd-test --package: the Debian package's life on a fresh
# Debian, run inside the booted container as qw-probe.service (root), the
# steps exactly as docs/service.md gives them: apt install the .deb, write
# one key, systemctl enable --now (ready: READY=1 and /readyz 200) and
# systemctl reload, the man page and the completions, apt remove (stops it),
# apt purge (removes its config). One line per check, with its time, to
# /qw-out/results.txt; the first failure ends the run.
#
# /qw-src: the one quota-worker_*.deb, read-only
# /qw-test: this directory, read-only; /qw-out: results, logs, journal
set -uo pipefail

OUT=/qw-out
RESULTS=$OUT/results.txt
MAIN=quota-worker.service
CONF=/etc/quota-worker/config/quota-worker.toml
KEY_FILE=/etc/quota-worker/credentials/yt-key1
KEY="package-test-key-$RANDOM$RANDOM"
export DEBIAN_FRONTEND=noninteractive

exec >>"$OUT/probe.log" 2>&1
. /qw-test/probe-lib.sh

on_exit() {
  local rc=$?
  [ "${completed:-0}" = 1 ] || [ "$rc" -ne 0 ] || rc=1
  journalctl -b --no-pager -o short-monotonic -u "$MAIN" >"$OUT/journal-units.txt" 2>&1
  echo "$rc" >"$OUT/probe.rc"
}
trap on_exit EXIT
trap 'log "probe interrupted (SIGTERM)"; exit 143' TERM

# step N CMD...: runs CMD (its output in the probe log), records its time in
# step_s; the exit code is returned.
step() {
  local t0 rc
  t0=$(now_ms)
  log "\$ ${*:2}"
  "${@:2}"; rc=$?
  step_s=$(secs "$t0" "$(now_ms)")
  return "$rc"
}
readyz() {
  python3 -c "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/readyz', timeout=2).status == 200 else 1)" 2>/dev/null
}
daemon_pids() { ps -eo pid=,comm= | awk '$2 == "quota-worker" { print $1 }'; }

log "probe starts; systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(systemctl is-system-running)"
# A fresh Debian has no policy-rc.d; this machine's (Docker's: every
# service action forbidden) would also keep `apt remove` from stopping the
# service. In the container's overlay only.
rm -f /usr/sbin/policy-rc.d
# Slim images (debian:*-slim) tell dpkg to drop every man page; a real
# Debian keeps them. Also in the overlay only.
for f in /etc/dpkg/dpkg.cfg.d/*; do
  [ -f "$f" ] && sed -i '/^path-exclude[= ]*\/usr\/share\/man\//d' "$f"
done
debs=(/qw-src/quota-worker_*.deb)
[ "${#debs[@]}" -eq 1 ] && [ -f "${debs[0]}" ] || fail 0 "expected one quota-worker_*.deb in /qw-src, found: ${debs[*]}"
# apt reads the file as _apt when it can: a copy it can read.
cp "${debs[0]}" /tmp/ && chmod 0644 /tmp/quota-worker_*.deb
cd /tmp || fail 0 "no /tmp"

# ---- 1. apt install: installed, configured, not started ---------------------
step 1 apt install -y ./quota-worker_*.deb >"$OUT/apt-install.log" 2>&1 \
  || { cat "$OUT/apt-install.log"; fail 1 "apt install ./quota-worker_*.deb failed"; }
install_s=$step_s
[ -x /usr/bin/quota-worker ] || fail 1 "no /usr/bin/quota-worker"
for f in "$CONF" /etc/quota-worker/jobs/trending.toml /usr/lib/systemd/system/quota-worker.service /usr/lib/systemd/system/quota-worker@.service; do
  [ -f "$f" ] || fail 1 "the package did not install $f"
done
conffiles=$(dpkg-query -W -f='${Conffiles}' quota-worker)
for f in "$CONF" /etc/quota-worker/jobs/trending.toml; do
  grep -qF " $f " <<<"$conffiles" || fail 1 "$f is not a conffile: $conffiles"
done
grep -q '^ExecStart=/usr/bin/quota-worker run ' /usr/lib/systemd/system/quota-worker.service \
  || fail 1 "the packaged unit does not run /usr/bin/quota-worker"
[ "$(stat -c %a:%U /etc/quota-worker/credentials)" = 700:root ] || fail 1 "/etc/quota-worker/credentials is not 0700 root"
state="$(systemctl is-enabled quota-worker)/$(prop $MAIN ActiveState)"
[ "$state" = disabled/inactive ] || fail 1 "after install the unit is $state, not disabled/inactive (unconfigured, it must not start)"
grep -qF 'systemctl enable --now quota-worker' "$OUT/apt-install.log" || fail 1 "apt install did not say how to start it"
pass 1 "apt install ./quota-worker_*.deb: ${install_s} s; /usr/bin/quota-worker, both units (ExecStart=/usr/bin/quota-worker), the example config and job as conffiles, credentials/ 0700; the unit disabled and not started (unconfigured)"

# ---- 2. one key, enable --now: ready ------------------------------------------
sh -c "umask 077; cat > $KEY_FILE" <<<"$KEY" || fail 2 "cannot write $KEY_FILE"
step 2 timeout 100 systemctl enable --now quota-worker || fail 2 "systemctl enable --now quota-worker failed"
enable_s=$step_s
state="$(prop $MAIN ActiveState)/$(prop $MAIN SubState)"
[ "$state" = active/running ] || fail 2 "enable --now returned with the unit $state"
ready_us=$(($(prop $MAIN ActiveEnterTimestampMonotonic) - $(prop $MAIN ExecMainStartTimestampMonotonic)))
ready_s=$(awk -v u="$ready_us" 'BEGIN { printf "%.2f", u / 1e6 }')
t0=$(now_ms)
wait_until 15 readyz || fail 2 "/readyz did not answer 200 within 15 s"
readyz_s=$(secs "$t0" "$(now_ms)")
pid=$(prop $MAIN MainPID)
limits=$(nofile $MAIN) || fail 2 "$limits"
journal_has $MAIN "$KEY" && fail 2 "the key is in the journal"
# The packaged ExecReload= runs the packaged binary (scripts/package rewrites
# its path as it does ExecStart's): reload returns once the daemon applied it.
step 2 timeout 60 systemctl reload quota-worker || fail 2 "systemctl reload quota-worker failed"
reload_s=$step_s
[ "$(prop $MAIN MainPID)" = "$pid" ] || fail 2 "systemctl reload restarted the daemon (main pid $pid -> $(prop $MAIN MainPID))"
journal_has $MAIN 'configuration reloaded' || fail 2 "the daemon did not log the reload"
pass 2 "key written, systemctl enable --now quota-worker: ${enable_s} s (start -> READY=1 ${ready_s} s), /readyz 200 ${readyz_s} s after; embedded Redis; $limits; systemctl reload: ${reload_s} s, same pid"

# ---- 3. man page and completions ---------------------------------------------
t0=$(now_ms)
man_out=$(MANPAGER=cat MANWIDTH=80 man quota-worker 2>&1) || fail 3 "man quota-worker failed: $man_out"
grep -q 'quota-worker-run(1)' <<<"$man_out" || fail 3 "man quota-worker does not list its commands: $man_out"
man -w quota-worker-trigger >/dev/null 2>&1 || fail 3 "no man page quota-worker-trigger"
complete_line=$(bash -c '. /usr/share/bash-completion/completions/quota-worker && complete -p quota-worker' 2>&1) \
  || fail 3 "the bash completion does not load: $complete_line"
[ -s /usr/share/zsh/vendor-completions/_quota-worker ] || fail 3 "no zsh completion"
[ -s /usr/share/fish/vendor_completions.d/quota-worker.fish ] || fail 3 "no fish completion"
pass 3 "man quota-worker (and quota-worker-trigger) renders, the bash completion loads ($complete_line), zsh's and fish's are installed ($(secs "$t0" "$(now_ms)") s)"

# ---- 4. apt remove: stopped ---------------------------------------------------
step 4 apt remove -y quota-worker >"$OUT/apt-remove.log" 2>&1 || { cat "$OUT/apt-remove.log"; fail 4 "apt remove failed"; }
remove_s=$step_s
state=$(prop $MAIN ActiveState)
[ "$state" != active ] || fail 4 "the service is still active after apt remove"
[ -z "$(daemon_pids)" ] || fail 4 "quota-worker still runs after apt remove: $(daemon_pids)"
kill -0 "$pid" 2>/dev/null && fail 4 "the daemon (pid $pid) still runs"
[ ! -e /usr/bin/quota-worker ] || fail 4 "/usr/bin/quota-worker left after remove"
[ -f "$CONF" ] || fail 4 "remove deleted the config (only purge may)"
journal_has $MAIN 'all running tasks finished' || fail 4 "the daemon did not shut down cleanly"
pass 4 "apt remove: ${remove_s} s; the service stopped cleanly (the daemon gone), the binary removed, the config kept"

# ---- 5. apt purge: config gone ------------------------------------------------
step 5 apt purge -y quota-worker >"$OUT/apt-purge.log" 2>&1 || { cat "$OUT/apt-purge.log"; fail 5 "apt purge failed"; }
purge_s=$step_s
[ ! -e /etc/quota-worker ] || fail 5 "/etc/quota-worker left after purge: $(find /etc/quota-worker | head)"
status=$(dpkg-query -W -f='${db:Status-Status}' quota-worker 2>/dev/null || echo not-installed)
[ "$status" = not-installed ] || fail 5 "dpkg says quota-worker is $status after purge"
[ -d /var/lib/private/quota-worker ] || fail 5 "purge removed the state (the quota windows and the records are data)"
pass 5 "apt purge: ${purge_s} s; /etc/quota-worker gone (the key too), the package unknown to dpkg, the state in /var/lib/private/quota-worker kept"

completed=1
log "all checks passed"
