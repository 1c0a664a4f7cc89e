// kafkajs group consumer for test_tail_lag.py: subscribe GROUP to TOPIC,
// print each message as a JSON line, and once N messages arrived wait until
// the group's committed offsets (admin fetchOffsets) equal TARGETS or the
// deadline passes; then print {"committed": {partition: offset}} and exit 0,
// so the test sees where kafkajs stopped. Bounded: exits 3 after TIMEOUT_MS.
//   node tail.js BOOTSTRAP TOPIC GROUP read_committed|read_uncommitted N TARGETS_JSON
const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, group, isolation, nStr, targetsJson] = process.argv.slice(2);
const n = Number(nStr);
const targets = JSON.parse(targetsJson);
const TIMEOUT_MS = 90000;
const SETTLE_MS = 8000;
setTimeout(() => { console.error("kafkajs tail timed out"); process.exit(3); }, TIMEOUT_MS).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function committed(admin) {
  const [t] = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  const out = {};
  for (const p of t.partitions) out[p.partition] = Number(p.offset);
  return out;
}

function reached(c) {
  return Object.entries(targets).every(([p, off]) => c[p] === off);
}

async function main() {
  const kafka = new Kafka({ clientId: "antidote-js-tail", brokers: [bootstrap], logLevel: logLevel.ERROR,
                            retry: { retries: 5 } });
  const admin = kafka.admin();
  await admin.connect();
  const consumer = kafka.consumer({ groupId: group, readUncommitted: isolation === "read_uncommitted" });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  let all;
  const allSeen = new Promise((resolve) => { all = resolve; });
  if (n === 0) all();
  if (process.env.TAIL_DEBUG) {
    const { START_BATCH_PROCESS, COMMIT_OFFSETS } = consumer.events;
    consumer.on(START_BATCH_PROCESS, (e) => console.error(Date.now(), "batch", JSON.stringify(e.payload)));
    consumer.on(COMMIT_OFFSETS, (e) => console.error(Date.now(), "commit", JSON.stringify(e.payload)));
  }
  // Commit every resolved offset, also those of fetches that deliver no
  // message (only control records): kafkajs's defaults commit those only
  // together with the next delivered message.
  consumer.run({
    autoCommitInterval: 300,
    autoCommitThreshold: 1,
    eachMessage: async ({ partition, message }) => {
      console.log(JSON.stringify({ partition, offset: Number(message.offset),
                                   key: message.key.toString() }));
      if (++seen === n) all();
    },
  });
  await allSeen;
  const deadline = Date.now() + SETTLE_MS;
  let c = await committed(admin);
  while (!reached(c) && Date.now() < deadline) {
    await sleep(300);
    c = await committed(admin);
  }
  // Anything delivered late (a re-read) still prints before this line.
  await sleep(500);
  if (process.env.TAIL_DEBUG) console.error(Date.now(), "disconnect", JSON.stringify(c));
  await consumer.disconnect();
  c = await committed(admin);
  console.log(JSON.stringify({ committed: c }));
  await admin.disconnect();
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
