// One BullMQ worker process of the comparison (started by bench.mjs, two
// at a time): a Worker on the queue with the given concurrency and, for the
// quota scenario, BullMQ's documented rate limiter `{ max, duration }`. A
// job does what a quota-worker task does for a one-page item: one GET of
// the simulated API's videos page for its region, and the page's records
// appended to a JSONL file as one write (quota-worker's jsonl sink writes
// `{job, item, fetched_at, record}` per record, a page per write(2)). A 403
// (the upstream's quotaExceeded) fails the job, and BullMQ retries it with
// the job's backoff, as a BullMQ user handles an upstream refusal.
//
// Argument: one JSON object {port, queue, sim, key, concurrency, limiter,
// sink}. Prints "ready" once connected; SIGTERM closes the worker (running
// jobs end first) and exits.
import { appendFile } from 'node:fs/promises';
import { Worker } from 'bullmq';

const cfg = JSON.parse(process.argv[2]);

const processor = async (job) => {
  const region = encodeURIComponent(job.data.region);
  const url = `${cfg.sim}/youtube/v3/videos?chart=mostPopular&regionCode=${region}&maxResults=1&key=${cfg.key}`;
  const res = await fetch(url);
  const body = await res.text();
  if (!res.ok) {
    throw new Error(`upstream answered ${res.status}: ${body.slice(0, 120)}`);
  }
  const page = JSON.parse(body);
  const at = new Date().toISOString();
  const lines = page.items
    .map((record) => JSON.stringify({ job: 'bench', item: job.data.region, fetched_at: at, record }) + '\n')
    .join('');
  await appendFile(cfg.sink, lines);
};

const worker = new Worker(cfg.queue, processor, {
  connection: { host: '127.0.0.1', port: cfg.port, maxRetriesPerRequest: null },
  concurrency: cfg.concurrency,
  ...(cfg.limiter ? { limiter: cfg.limiter } : {}),
});
worker.on('error', (e) => console.error(`worker error: ${e.message}`));
await worker.waitUntilReady();
console.log('ready');

const stop = async () => {
  await worker.close();
  process.exit(0);
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
