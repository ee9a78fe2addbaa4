// The BullMQ producer of the comparison (started by bench.mjs): connects a
// Queue, prints "ready", and on the line "go" on its stdin adds one job per
// item in one addBulk (as `quota-worker trigger` fans a tick out in one
// script), then prints "added". Started ahead of the measured run so that
// node's start-up is not in the drain time (quota-worker's trigger is a
// native binary that starts in milliseconds).
//
// Argument: one JSON object {port, queue, items, attempts, backoff_ms}.
// A job failed by the upstream (a 403) is retried up to `attempts` times
// with BullMQ's exponential backoff from `backoff_ms`.
import { createInterface } from 'node:readline';
import { Queue } from 'bullmq';

const cfg = JSON.parse(process.argv[2]);
const queue = new Queue(cfg.queue, {
  connection: { host: '127.0.0.1', port: cfg.port, maxRetriesPerRequest: null },
});
await queue.waitUntilReady();
console.log('ready');

const opts = { attempts: cfg.attempts, backoff: { type: 'exponential', delay: cfg.backoff_ms } };
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === 'go') {
    const jobs = [];
    for (let i = 0; i < cfg.items; i++) {
      jobs.push({ name: 'fetch', data: { region: `r${String(i).padStart(5, '0')}` }, opts });
    }
    await queue.addBulk(jobs);
    console.log('added');
  }
}
await queue.close();
