// quota-worker beside BullMQ on the same simulated metered API (issue 28),
// end to end: run by benches/bullmq/run, which installs BullMQ with npm
// when asked and builds the release binaries. Not part of CI.
//
// One qw-simulator process (crates/simulator) is the upstream of every run;
// each run has a key of its own on it, so no run inherits another's window.
// Each run gets a fresh private redis-server (no persistence) and two
// long-lived processes of the system under test: two `quota-worker run`
// daemons, or two node processes each with a BullMQ Worker; quota-worker's
// tick is fanned out by `quota-worker trigger`, BullMQ's jobs are added by
// a producer process started beforehand. Every server binds 127.0.0.1 on a
// free port, and every process started here is stopped by its pid when
// the run ends, and on exit whatever happens.
//
// Scenarios (the issue's):
//   A: ITEMS one-page items, the upstream a sliding UNITS per WINDOW s that
//      answers 403 quotaExceeded above it; quota-worker's credential has the
//      same window, BullMQ's Worker its documented limiter { max, duration }.
//   B: 2,000 one-page items, no quota in the way.
//   idle: the two processes of each system, started, then 10 s counted.
// Measured per run: what the upstream saw (requests, 2xx, 403s, when the
// last page was fetched, the most requests in any second), the drain time
// (trigger/addBulk → the last page fetched), Redis CPU and commands per
// task (INFO cpu and INFO commandstats deltas; commandstats counts the
// commands scripts run too), the two processes' CPU (/proc/PID/stat).
// Writes target/bullmq-bench/report.md and report.json.

import { spawn, execFileSync } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdirSync, rmSync, writeFileSync, readFileSync, existsSync, readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { cpus, loadavg } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import Redis from 'ioredis';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '../..');
const OUT = join(ROOT, 'target/bullmq-bench');
const QW = join(ROOT, 'target/release/quota-worker');
const SIM = join(ROOT, 'target/release/qw-simulator');
const CONCURRENCY = 8; // quota-worker's default [worker] concurrency, per process
const IDLE_SECS = 10;

const quick = process.argv.includes('--quick');
const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
};
// --quick: a smoke run of a minute (the same code paths, a smaller quota).
const A = quick
  ? { items: 24, units: 8, secs: 3 }
  : { items: 200, units: 40, secs: 15 };
const B = { items: quick ? 200 : 2000 };
const ROUNDS_A = arg('--rounds-a', quick ? 1 : 2);
const ROUNDS_B = arg('--rounds-b', quick ? 1 : 3);
const ROUNDS_IDLE = arg('--rounds-idle', quick ? 1 : 2);
const SYSTEMS = ['quota-worker', 'bullmq'];

// ---- processes: every child is recorded, and stopped by its pid on exit

const children = new Set();

function start(label, cmd, args, opts = {}) {
  const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], ...opts });
  child.label = label;
  child.log = [];
  const keep = (stream) =>
    createInterface({ input: stream }).on('line', (l) => {
      child.log.push(l);
      if (child.log.length > 400) child.log.shift();
    });
  keep(child.stdout);
  keep(child.stderr);
  child.exited = new Promise((res) => child.on('exit', (code, sig) => res({ code, sig })));
  child.exited.then(() => children.delete(child));
  children.add(child);
  return child;
}

async function stop(child, timeoutMs = 15000) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  process.kill(child.pid, 'SIGTERM');
  const t = sleep(timeoutMs).then(() => 'timeout');
  if ((await Promise.race([child.exited, t])) === 'timeout') {
    process.kill(child.pid, 'SIGKILL');
    await child.exited;
  }
}

function killAll() {
  for (const c of children) {
    try {
      process.kill(c.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    killAll();
    process.exit(130);
  });
}

async function waitFor(what, check, timeoutMs, everyMs = 50) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

const failed = (child, what) =>
  new Error(`${child.label} ${what}; its last output:\n${child.log.slice(-30).join('\n')}`);

async function waitLine(child, pattern, timeoutMs) {
  return waitFor(`${child.label}: ${pattern}`, () => {
    if (child.exitCode !== null) throw failed(child, `exited (${child.exitCode})`);
    return child.log.some((l) => pattern.test(l));
  }, timeoutMs);
}

// ---- Redis: a private server per run

async function startRedis(dir) {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const child = start('redis-server', 'redis-server', [
      '--bind', '127.0.0.1', '--port', String(port), '--save', '', '--appendonly', 'no',
      '--dir', dir, '--protected-mode', 'yes',
    ]);
    try {
      await waitLine(child, /Ready to accept connections/, 10000);
      const client = new Redis({ host: '127.0.0.1', port, lazyConnect: true });
      await client.connect();
      return { child, port, client };
    } catch (e) {
      await stop(child);
      if (attempt >= 4) throw e;
    }
  }
}

// Calls per command and Redis CPU, since the last CONFIG RESETSTAT. INFO
// and CONFIG are this script's own and not counted.
async function redisCounters(client) {
  const stats = await client.info('commandstats');
  let commands = 0;
  let scripts = 0;
  const per = {};
  for (const m of stats.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    const [name, calls] = [m[1], Number(m[2])];
    if (name === 'info' || name === 'config') continue;
    per[name] = calls;
    commands += calls;
    if (/^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/.test(name)) scripts += calls;
  }
  const cpu = await client.info('cpu');
  const num = (f) => Number(cpu.match(new RegExp(`^${f}:([\\d.]+)`, 'm'))[1]);
  return { commands, scripts, cpu_us: (num('used_cpu_sys') + num('used_cpu_user')) * 1e6, per };
}

async function resetCounters(client) {
  await client.config('RESETSTAT');
  return redisCounters(client);
}

const diff = (b, a) => ({
  commands: b.commands - a.commands,
  scripts: b.scripts - a.scripts,
  cpu_us: b.cpu_us - a.cpu_us,
  per: Object.fromEntries(Object.entries(b.per).map(([k, v]) => [k, v - (a.per[k] || 0)])),
});

// utime + stime of a process, in ms.
const TICK_MS = 1000 / Number(execFileSync('getconf', ['CLK_TCK']).toString().trim());
function cpuMs(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(f[11]) + Number(f[12])) * TICK_MS;
}

// ---- the simulator

let sim;
async function simStats() {
  const res = await fetch(sim.stats);
  return (await res.json()).keys;
}

// ---- the two systems

const regions = (n) => Array.from({ length: n }, (_, i) => `r${String(i).padStart(5, '0')}`);

function qwFiles(dir, redisPort, key, items, window) {
  mkdirSync(join(dir, 'jobs'), { recursive: true });
  mkdirSync(join(dir, 'data'), { recursive: true });
  writeFileSync(join(dir, 'config.toml'), `jobs = "jobs/*.toml"
state_dir = "state"

[redis]
url = "redis://127.0.0.1:${redisPort}"

[worker]
concurrency = ${CONCURRENCY}
shutdown_timeout = "10s"

[metrics]
listen = "off"

[credentials.bench]
secret_env = "QW_BENCH_KEY"
windows = [{ units = ${window.units}, per = "${window.secs}s" }]

[endpoints."youtube.videos.list"]
credential = "bench"
cost = 1
`);
  writeFileSync(join(dir, 'jobs/bench.toml'), `[bench]
# Never fires by itself: the bench triggers it.
schedule = "0 0 0 1 1 * 2099"
endpoint = "youtube.videos.list"
fan_out = { region = [${regions(items).map((r) => `"${r}"`).join(', ')}] }
# A refused spend re-queues the task for when the window has room (the
# issue's run: 0 upstream 403s, 61.2 s for 200 items at 40 per 15 s).
on_quota_exhausted = "defer"

[bench.request]
url = "${sim.url}/youtube/v3/videos"
query = { chart = "mostPopular", regionCode = "{region}", maxResults = "1", key = "{secret}" }

[bench.sink]
kind = "jsonl"
path = "data/{job}.jsonl"
records = "/items"
`);
}

const systems = {
  'quota-worker': {
    // Two daemons, ready once each has logged that its workers run.
    async start(dir, redis, key, items, window) {
      qwFiles(dir, redis.port, key, items, window);
      const env = { PATH: process.env.PATH, QW_BENCH_KEY: key, RUST_LOG: 'warn' };
      const procs = [1, 2].map((i) =>
        start(`quota-worker ${i}`, QW, ['--config', join(dir, 'config.toml'), 'run'], { env, cwd: dir }),
      );
      await waitFor('two quota-worker daemons', async () => {
        for (const p of procs) if (p.exitCode !== null) throw failed(p, `exited (${p.exitCode})`);
        const clients = await redis.client.client('LIST');
        return (clients.match(/cmd=xread/g) || []).length >= 2;
      }, 30000, 100);
      return {
        procs,
        others: [],
        async go() {
          const t = start('quota-worker trigger', QW, ['--config', join(dir, 'config.toml'), 'trigger', 'bench'], { env, cwd: dir });
          const { code } = await t.exited;
          if (code !== 0) throw failed(t, `exited ${code}`);
        },
        stored: () => countLines([join(dir, 'data/bench.jsonl')]),
      };
    },
  },
  bullmq: {
    async start(dir, redis, key, items, window) {
      mkdirSync(dir, { recursive: true });
      const base = { port: redis.port, queue: 'bench' };
      const limiter = window.limited ? { max: window.units, duration: window.secs * 1000 } : null;
      const sinks = [1, 2].map((i) => join(dir, `sink-${i}.jsonl`));
      const procs = [1, 2].map((i) =>
        start(`bullmq worker ${i}`, 'node', [join(HERE, 'worker.mjs'), JSON.stringify({
          ...base, sim: sim.url, key, concurrency: CONCURRENCY, limiter, sink: sinks[i - 1],
        })], { cwd: HERE }),
      );
      const producer = start('bullmq producer', 'node', [join(HERE, 'producer.mjs'), JSON.stringify({
        ...base, items, attempts: 10, backoff_ms: 1000,
      })], { cwd: HERE });
      for (const p of [...procs, producer]) await waitLine(p, /^ready$/, 30000);
      return {
        procs,
        // Stopped with the workers: an idle run never says "go" to it.
        others: [producer],
        async go() {
          producer.stdin.write('go\n');
          await waitLine(producer, /^added$/, 60000);
          producer.stdin.end();
          await producer.exited;
        },
        stored: () => countLines(sinks),
      };
    },
  },
};

function countLines(files) {
  let n = 0;
  for (const f of files) {
    if (!existsSync(f)) continue;
    const s = readFileSync(f);
    for (let i = 0; i < s.length; i++) if (s[i] === 10) n++;
  }
  return n;
}

// One measured run: start the two processes, reset the counters, fan
// `items` out, wait until the upstream has answered every item 2xx and the
// sinks hold them all, then read the counters.
async function run({ system, kind: scenario, round, items, window, key }) {
  const name = `${scenario}-${system}-${round}`;
  const dir = join(OUT, 'runs', name);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const redis = await startRedis(dir);
  let sys;
  try {
    sys = await systems[system].start(join(dir, 'sys'), redis, key, items, window);
    await sleep(1000); // past the start-up's own Redis work
    const r0 = await resetCounters(redis.client);
    const cpu0 = sys.procs.map((p) => cpuMs(p.pid));
    const load0 = loadavg()[0];
    const t0 = Date.now();
    await sys.go();
    const limit = window.limited ? 600000 : 300000;
    // Read the sinks, not Redis (that would count): the simulator is asked
    // only once they hold every item. The drain time is the simulator's
    // (its last charge), not this loop's.
    await waitFor(`${name}: ${items} items fetched and stored`, async () => {
      for (const p of sys.procs) if (p.exitCode !== null) throw failed(p, `exited (${p.exitCode})`);
      return sys.stored() >= items && (await simStats())[key].ok >= items;
    }, limit, 200);
    // The last task's own end (its ack, its finish) is part of its cost.
    await sleep(500);
    const r1 = await redisCounters(redis.client);
    const cpu1 = sys.procs.map((p) => cpuMs(p.pid));
    const s = (await simStats())[key];
    const drain = (s.last_charge_ms - t0) / 1000;
    const redisDelta = diff(r1, r0);
    const result = {
      system, scenario, round, items, key,
      load: [load0, loadavg()[0]],
      upstream: s,
      drain_s: drain,
      // Of what a sliding window of U per W lets through in T s from empty
      // (U at once, then U per W): U × (1 + T/W).
      utilization: window.limited ? s.units / (window.units * (1 + drain / window.secs)) : null,
      tasks_per_s: items / drain,
      stored: sys.stored(),
      worker_cpu_ms_per_task: (cpu1.reduce((a, b) => a + b) - cpu0.reduce((a, b) => a + b)) / items,
      redis_cpu_us_per_task: redisDelta.cpu_us / items,
      commands_per_task: redisDelta.commands / items,
      scripts_per_task: redisDelta.scripts / items,
      commands: redisDelta.per,
    };
    console.log(`  ${name}: ${summary(result)}`);
    return result;
  } finally {
    if (sys) for (const p of [...sys.procs, ...sys.others]) await stop(p);
    redis.client.disconnect();
    await stop(redis.child);
  }
}

// Two processes of `system` idle for IDLE_SECS: commands/s.
async function idle({ system, round, window, key }) {
  const name = `idle-${system}-${round}`;
  const dir = join(OUT, 'runs', name);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const redis = await startRedis(dir);
  let sys;
  try {
    sys = await systems[system].start(join(dir, 'sys'), redis, key, 1, window);
    await sleep(3000);
    const r0 = await resetCounters(redis.client);
    const cpu0 = sys.procs.map((p) => cpuMs(p.pid));
    await sleep(IDLE_SECS * 1000);
    const r1 = await redisCounters(redis.client);
    const cpu1 = sys.procs.map((p) => cpuMs(p.pid));
    const d = diff(r1, r0);
    const result = {
      system, scenario: 'idle', round, secs: IDLE_SECS,
      commands_per_s: d.commands / IDLE_SECS,
      scripts_per_s: d.scripts / IDLE_SECS,
      redis_cpu_us_per_s: d.cpu_us / IDLE_SECS,
      process_cpu_ms_per_s: (cpu1.reduce((a, b) => a + b) - cpu0.reduce((a, b) => a + b)) / IDLE_SECS,
      commands: d.per,
    };
    console.log(`  ${name}: ${result.commands_per_s.toFixed(2)} commands/s (two processes)`);
    return result;
  } finally {
    if (sys) for (const p of [...sys.procs, ...sys.others]) await stop(p);
    redis.client.disconnect();
    await stop(redis.child);
  }
}

function summary(r) {
  const u = r.upstream;
  return [
    `${u.requests} requests, ${u.quota_errors} 403s, max ${u.max_requests_in_1s} in 1 s`,
    `drain ${r.drain_s.toFixed(1)} s`,
    r.utilization !== null ? `utilization ${r.utilization.toFixed(3)}` : `${r.tasks_per_s.toFixed(0)} tasks/s`,
    `worker CPU ${r.worker_cpu_ms_per_task.toFixed(2)} ms/task`,
    `Redis ${r.redis_cpu_us_per_task.toFixed(0)} µs, ${r.commands_per_task.toFixed(1)} commands, ${r.scripts_per_task.toFixed(2)} scripts per task`,
  ].join('; ');
}

// ---- the plan, the report

function plan() {
  // Interleaved: each round runs both systems, the first one alternating.
  const steps = [];
  const order = (i) => (i % 2 === 0 ? SYSTEMS : [...SYSTEMS].reverse());
  const a = { units: A.units, secs: A.secs, limited: true };
  const b = { units: 1e12, secs: 3600, limited: false };
  const rounds = Math.max(ROUNDS_A, ROUNDS_B, ROUNDS_IDLE);
  for (let i = 0; i < rounds; i++) {
    for (const s of order(i)) if (i < ROUNDS_B) steps.push({ kind: 'B', system: s, round: i + 1, items: B.items, window: b });
    for (const s of order(i)) if (i < ROUNDS_IDLE) steps.push({ kind: 'idle', system: s, round: i + 1, window: b });
    for (const s of order(i + 1)) if (i < ROUNDS_A) steps.push({ kind: 'A', system: s, round: i + 1, items: A.items, window: a });
  }
  // The simulator's keys are fixed at its start: a key of its own per run,
  // so that no run inherits another's window.
  steps.forEach((st, i) => {
    st.key = `k${i + 1}-${st.kind}-${st.system}`;
  });
  return { steps, keys: steps.map((st) => `${st.key}:${st.window.units}:${st.window.secs}`) };
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

function fmt(xs, digits) {
  const f = (x) => x.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
  if (xs.length === 0) return '–';
  const lo = Math.min(...xs);
  const hi = Math.max(...xs);
  return lo === hi ? f(lo) : `${f(median(xs))} (${f(lo)}–${f(hi)})`;
}

function report(meta, results) {
  const pick = (scenario, system, f) => results.filter((r) => r.scenario === scenario && r.system === system).map(f);
  const row = (label, scenario, f, digits) =>
    `| ${label} | ${SYSTEMS.map((s) => fmt(pick(scenario, s, f), digits)).join(' | ')} |`;
  const a = `${A.items} items, a sliding ${A.units} units per ${A.secs} s`;
  const least = ((A.items / A.units - 1) * A.secs).toFixed(0);
  const lines = [
    '# quota-worker beside BullMQ, end to end',
    '',
    '| | |',
    '|---|---|',
    ...Object.entries(meta).map(([k, v]) => `| ${k} | ${v} |`),
    '',
    'Each cell: the median of the rounds (the range in brackets). Per task: a delta over the run ÷ the items.',
    '',
    `| scenario | quota-worker | BullMQ ${meta.bullmq} |`,
    '|---|---:|---:|',
    row(`A (${a}): upstream 403s`, 'A', (r) => r.upstream.quota_errors, 0),
    row(`A: requests the upstream saw`, 'A', (r) => r.upstream.requests, 0),
    row(`A: the most requests in any 1 s`, 'A', (r) => r.upstream.max_requests_in_1s, 0),
    row(`A: the most units charged in any ${A.secs} s`, 'A', (r) => r.upstream.max_units_in_window, 0),
    row(`A: time until all ${A.items} fetched, s (${least} s is the least possible)`, 'A', (r) => r.drain_s, 1),
    row('A: utilization of what the upstream allowed', 'A', (r) => r.utilization, 3),
    row('A: Redis commands per task', 'A', (r) => r.commands_per_task, 1),
    row('A: script calls per task', 'A', (r) => r.scripts_per_task, 2),
    row('A: Redis CPU per task, µs', 'A', (r) => r.redis_cpu_us_per_task, 0),
    row(`B (${B.items} one-page items, no quota in the way): tasks/s`, 'B', (r) => r.tasks_per_s, 0),
    row('B: worker CPU per task, ms (the two processes)', 'B', (r) => r.worker_cpu_ms_per_task, 2),
    row('B: Redis CPU per task, µs', 'B', (r) => r.redis_cpu_us_per_task, 0),
    row('B: Redis commands per task', 'B', (r) => r.commands_per_task, 1),
    row('B: script calls per task', 'B', (r) => r.scripts_per_task, 2),
    row(`idle: Redis commands/s, two processes, ${IDLE_SECS} s`, 'idle', (r) => r.commands_per_s, 2),
    row('idle: Redis CPU, µs/s', 'idle', (r) => r.redis_cpu_us_per_s, 0),
    '',
    '## Every run',
    '',
    '| run | load | requests | 403s | max in 1 s | drain s | utilization | tasks/s | worker CPU ms/task | Redis µs/task | commands/task | scripts/task |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...results.filter((r) => r.scenario !== 'idle').map((r) =>
      `| ${r.scenario} ${r.system} ${r.round} | ${r.load.map((l) => l.toFixed(1)).join('–')} | ${r.upstream.requests} | ${r.upstream.quota_errors} | ${r.upstream.max_requests_in_1s} | ${r.drain_s.toFixed(1)} | ${r.utilization === null ? '' : r.utilization.toFixed(3)} | ${r.scenario === 'B' ? r.tasks_per_s.toFixed(0) : ''} | ${r.worker_cpu_ms_per_task.toFixed(2)} | ${r.redis_cpu_us_per_task.toFixed(0)} | ${r.commands_per_task.toFixed(1)} | ${r.scripts_per_task.toFixed(2)} |`),
    '',
    '| idle run | commands/s | script calls/s | Redis CPU µs/s | the two processes\' CPU ms/s |',
    '|---|---:|---:|---:|---:|',
    ...results.filter((r) => r.scenario === 'idle').map((r) =>
      `| ${r.system} ${r.round} | ${r.commands_per_s.toFixed(2)} | ${r.scripts_per_s.toFixed(2)} | ${r.redis_cpu_us_per_s.toFixed(0)} | ${r.process_cpu_ms_per_s.toFixed(2)} |`),
    '',
    '## Commands per task, by command (B, median of the rounds)',
    '',
    `| command | ${SYSTEMS.join(' | ')} |`,
    '|---|---:|---:|',
    ...commandRows(results),
    '',
  ];
  return lines.join('\n');
}

function commandRows(results) {
  const names = new Set();
  const per = {};
  for (const s of SYSTEMS) {
    const runs = results.filter((r) => r.scenario === 'B' && r.system === s);
    per[s] = {};
    for (const r of runs) for (const k of Object.keys(r.commands)) names.add(k);
    for (const k of names) per[s][k] = median(runs.map((r) => (r.commands[k] || 0) / r.items));
  }
  return [...names]
    .map((k) => [k, SYSTEMS.map((s) => per[s][k] || 0)])
    .filter(([, v]) => v.some((x) => x >= 0.005))
    .sort((x, y) => Math.max(...y[1]) - Math.max(...x[1]))
    .map(([k, v]) => `| ${k} | ${v.map((x) => x.toFixed(2)).join(' | ')} |`);
}

// ---- main

const t0 = Date.now();
mkdirSync(OUT, { recursive: true });
rmSync(join(OUT, 'runs'), { recursive: true, force: true });
const { steps, keys } = plan();
rmSync(join(OUT, 'sim.json'), { force: true });
const simChild = start('qw-simulator', SIM, [
  ...keys.flatMap((k) => ['--key', k]),
  '--addr-file', join(OUT, 'sim.json'),
]);
await waitFor('qw-simulator', () => {
  if (simChild.exitCode !== null) throw failed(simChild, `exited (${simChild.exitCode})`);
  return existsSync(join(OUT, 'sim.json'));
}, 30000);
sim = JSON.parse(readFileSync(join(OUT, 'sim.json'), 'utf8'));

const git = (...a) => execFileSync('git', ['-C', ROOT, ...a]).toString().trim();
const bullmqVersion = JSON.parse(readFileSync(join(HERE, 'node_modules/bullmq/package.json'), 'utf8')).version;
const load0 = loadavg().map((l) => l.toFixed(2)).join(' ');
const results = [];
for (const st of steps) {
  console.log(`${st.kind} ${st.system} round ${st.round}`);
  results.push(st.kind === 'idle' ? await idle(st) : await run(st));
}
await stop(simChild);
const dirty = git('status', '--porcelain', '--untracked-files=no', '--', 'src', 'lua', 'crates', 'Cargo.toml', 'Cargo.lock') ? ' (with uncommitted changes)' : '';
const meta = {
  date: new Date(t0).toISOString().replace('T', ' ').slice(0, 16) + ' UTC',
  machine: `${cpus().length} × \`${cpus()[0].model.trim()}\``,
  Redis: `${execFileSync('redis-server', ['--version']).toString().match(/v=(\S+)/)[1]}, a private server per run, no persistence`,
  code: `\`${git('rev-parse', '--short', 'HEAD')}\`${dirty}, release build`,
  bullmq: bullmqVersion,
  'node': process.version,
  'processes': `two of each system, concurrency ${CONCURRENCY} each; one qw-simulator for all runs`,
  'load average': `${load0} at start, ${loadavg().map((l) => l.toFixed(2)).join(' ')} at end`,
  'run time': `${Math.round((Date.now() - t0) / 1000)} s`,
  rounds: `A ${ROUNDS_A}, B ${ROUNDS_B}, idle ${ROUNDS_IDLE}${quick ? ' (--quick: a smaller quota and fan-out)' : ''}`,
};
writeFileSync(join(OUT, 'report.json'), JSON.stringify({ meta, scenario_a: A, scenario_b: B, results }, null, 2) + '\n');
writeFileSync(join(OUT, 'report.md'), report(meta, results));
rmSync(join(OUT, 'runs'), { recursive: true, force: true });
console.log(`\nwrote ${join(OUT, 'report.md')} and report.json`);
// Whatever might still hold the event loop (a child's pipe), the run is
// over: exit, which stops every child still running (killAll).
process.exit(0);
