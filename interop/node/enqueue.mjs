#!/usr/bin/env node
// Enqueue one evsched job from Node.js, written from docs/wire-format.md alone: no evsched code,
// only public libraries (kafkajs for Kafka, avsc for Avro) and Node's own crypto.
//
//   EVSCHED_KAFKA_BOOTSTRAP=127.0.0.1:19092 EVSCHED_NAMESPACE=evsched \
//     node enqueue.mjs reports.build --queue default --args '["2026-03"]' --kwargs '{"force":true}'
//
// Prints the job id on stdout; where the record landed goes to stderr as one JSON line.
// With --dry-run nothing is sent: stdout gets one JSON line with the topic, key and value (hex).

import { createHash, randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

import avro from 'avsc'
import kafkajs from 'kafkajs'

const { Kafka, Partitioners, logLevel } = kafkajs

const HERE = dirname(fileURLToPath(import.meta.url))
const USAGE = `usage: node enqueue.mjs TASK [options]

  --queue Q             queue (default: default)
  --args JSON           positional arguments, a JSON array (default: [])
  --kwargs JSON         keyword arguments, a JSON object (default: {})
  --idempotency-key K   derive the job id from (queue, K): repeats make one job
  --job-id ID           use this job id (default: a random UUIDv4)
  --event-id ID         use this event id, e.g. to retry a send (default: a random UUIDv4)
  --delay-ms N          earliest start N ms from now (default: as soon as possible)
  --priority N          (default: 0)
  --max-attempts N      (default: 3)
  --timeout-ms N        run-time limit of one attempt (default: 300000)
  --label K=V           a label; repeatable
  --traceparent TP      W3C traceparent to carry to the worker
  --tracestate TS       W3C tracestate (with --traceparent)
  --source S            who writes (default: client-node)
  --emitted-at MS       the producer clock to record, epoch ms (default: now; for test vectors)
  --bootstrap HOSTS     default: $EVSCHED_KAFKA_BOOTSTRAP, else 127.0.0.1:19092
  --namespace NS        default: $EVSCHED_NAMESPACE, else evsched
  --schemas DIR         folder of the .avsc files (default: $EVSCHED_SCHEMAS, else ../../schemas)
  --dry-run             encode and print, send nothing`

// --- the wire format, by the document -----------------------------------------------------------

// UUIDv5 namespace of evsched's derived ids, and the name of a keyed job: "job\0<queue>\0<key>".
const EVSCHED_NAMESPACE = '6f1c1c3e-6b0e-5d8a-9a57-2f0a3d7c9e41'

/** RFC 9562 UUIDv5: SHA-1 of namespace bytes + UTF-8 name, version 5, variant 10. */
export function uuidV5(namespace, name) {
  const bytes = createHash('sha1')
    .update(Buffer.from(namespace.replaceAll('-', ''), 'hex'))
    .update(Buffer.from(name, 'utf8'))
    .digest()
    .subarray(0, 16)
  bytes[6] = (bytes[6] & 0x0f) | 0x50
  bytes[8] = (bytes[8] & 0x3f) | 0x80
  const hex = bytes.toString('hex')
  return [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20), hex.slice(20)].join('-')
}

export const jobIdForKey = (queue, key) => uuidV5(EVSCHED_NAMESPACE, `job\0${queue}\0${key}`)

// CRC-64-AVRO (the Avro specification's Rabin fingerprint) over the Parsing Canonical Form.
const EMPTY = 0xc15d213aa4d7a795n
const TABLE = Array.from({ length: 256 }, (_, i) => {
  let fp = BigInt(i)
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & -(fp & 1n))
  return fp
})

/** The 64-bit fingerprint of `bytes`, as a BigInt. */
export function crc64Avro(bytes) {
  let fp = EMPTY
  for (const b of bytes) fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(b)) & 0xffn)]
  return fp
}

/** avsc's `schema()` is the Parsing Canonical Form (full names, only name/type/fields/...). */
export const canonicalForm = (type) => JSON.stringify(type.schema())

/** `C3 01` + the fingerprint as 8 little-endian bytes: the header of every value. */
export function singleObjectHeader(type) {
  const header = Buffer.alloc(10)
  header[0] = 0xc3
  header[1] = 0x01
  header.writeBigUInt64LE(crc64Avro(Buffer.from(canonicalForm(type), 'utf8')), 2)
  return header
}

const byCodePoint = (a, b) => {
  const x = [...a]
  const y = [...b]
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0)
    if (d !== 0) return d
  }
  return x.length - y.length
}

/** Canonical JSON: keys sorted by code point at every level, no whitespace, UTF-8 as is. */
export function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`
  if (value !== null && typeof value === 'object') {
    const keys = Object.keys(value).sort(byCodePoint)
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`
  }
  if (typeof value === 'number' && !Number.isFinite(value)) throw new Error(`not JSON: ${value}`)
  return JSON.stringify(value)
}

/** SHA-256 over (8-byte big-endian length, bytes) of task, queue and args. */
export function bodyDigest(task, queue, args) {
  const hash = createHash('sha256')
  for (const part of [Buffer.from(task, 'utf8'), Buffer.from(queue, 'utf8'), args]) {
    const length = Buffer.alloc(8)
    length.writeBigUInt64BE(BigInt(part.length))
    hash.update(length).update(part)
  }
  return hash.digest()
}

const TRACEPARENT = /^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/
const NAME_PART = /^[A-Za-z0-9._-]+$/

// --- the command ----------------------------------------------------------------------------------

class UsageError extends Error {}

function parseJson(text, what, check) {
  let value
  try {
    value = JSON.parse(text)
  } catch (error) {
    throw new UsageError(`${what} is not JSON: ${error.message}`)
  }
  if (!check(value)) throw new UsageError(`${what} has the wrong shape: ${text}`)
  return value
}

function integer(text, what, min) {
  if (text === undefined) return undefined
  const n = Number(text)
  if (!Number.isSafeInteger(n) || n < min) throw new UsageError(`${what} must be an integer >= ${min}`)
  return n
}

function parseCommandLine(argv, env) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      queue: { type: 'string', default: 'default' },
      args: { type: 'string', default: '[]' },
      kwargs: { type: 'string', default: '{}' },
      'idempotency-key': { type: 'string' },
      'job-id': { type: 'string' },
      'event-id': { type: 'string' },
      'delay-ms': { type: 'string' },
      priority: { type: 'string', default: '0' },
      'max-attempts': { type: 'string', default: '3' },
      'timeout-ms': { type: 'string', default: '300000' },
      label: { type: 'string', multiple: true, default: [] },
      traceparent: { type: 'string' },
      tracestate: { type: 'string' },
      source: { type: 'string', default: 'client-node' },
      'emitted-at': { type: 'string' },
      bootstrap: { type: 'string', default: env.EVSCHED_KAFKA_BOOTSTRAP || '127.0.0.1:19092' },
      namespace: { type: 'string', default: env.EVSCHED_NAMESPACE || 'evsched' },
      schemas: { type: 'string', default: env.EVSCHED_SCHEMAS || join(HERE, '..', '..', 'schemas') },
      'dry-run': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  })
}

function readOptions(argv, env) {
  let parsed
  try {
    parsed = parseCommandLine(argv, env)
  } catch (error) {
    throw error.code?.startsWith('ERR_PARSE_ARGS') ? new UsageError(error.message) : error
  }
  const { values, positionals } = parsed
  if (values.help) return { help: true }
  if (positionals.length !== 1) throw new UsageError('give exactly one TASK')
  const options = { ...values, task: positionals[0] }
  if (!options.task) throw new UsageError('TASK must not be empty')
  for (const name of ['idempotency-key', 'job-id', 'event-id']) {
    const value = options[name]
    if (value !== undefined && (value.length === 0 || value.length > 512)) {
      throw new UsageError(`--${name} must have 1 to 512 characters`)
    }
  }
  if (!NAME_PART.test(options.namespace)) throw new UsageError(`bad namespace ${options.namespace}`)
  if (!NAME_PART.test(options.queue)) throw new UsageError(`bad queue ${options.queue}`)
  if (options['idempotency-key'] !== undefined && options['job-id'] !== undefined) {
    throw new UsageError('a keyed job has a derived id: give --idempotency-key or --job-id')
  }
  if (options.traceparent !== undefined && !TRACEPARENT.test(options.traceparent)) {
    throw new UsageError(`traceparent ${options.traceparent} is not 00-<32 hex>-<16 hex>-<2 hex>`)
  }
  if (options.tracestate !== undefined && options.traceparent === undefined) {
    throw new UsageError('--tracestate needs --traceparent')
  }
  return options
}

function buildEnqueue(options, now) {
  const args = Buffer.from(
    canonicalJson({
      args: parseJson(options.args, '--args', Array.isArray),
      kwargs: parseJson(options.kwargs, '--kwargs', (v) => v !== null && typeof v === 'object' && !Array.isArray(v)),
    }),
    'utf8',
  )
  const key = options['idempotency-key'] ?? null
  const delay = integer(options['delay-ms'], '--delay-ms', 0)
  const labels = {}
  for (const label of options.label) {
    const at = label.indexOf('=')
    if (at < 1) throw new UsageError(`--label ${label} is not K=V`)
    labels[label.slice(0, at)] = label.slice(at + 1)
  }
  return {
    event_id: options['event-id'] ?? randomUUID(),
    job_id: key !== null ? jobIdForKey(options.queue, key) : (options['job-id'] ?? randomUUID()),
    emitted_at: now,
    source: options.source,
    task: options.task,
    queue: options.queue,
    args,
    run_at: delay === undefined ? null : now + delay,
    priority: integer(options.priority, '--priority', Number.MIN_SAFE_INTEGER),
    max_attempts: integer(options['max-attempts'], '--max-attempts', 1),
    retry: { initial_backoff_ms: 1000, max_backoff_ms: 300000, multiplier: 2.0, jitter: 0.1 },
    timeout_ms: integer(options['timeout-ms'], '--timeout-ms', 1),
    idempotency_key: key,
    body_digest: bodyDigest(options.task, options.queue, args),
    labels,
    schedule_id: null,
    fire_at: null,
    trace:
      options.traceparent === undefined
        ? null
        : { traceparent: options.traceparent, tracestate: options.tracestate ?? null },
    retention_ms: null,
    key_window_ms: null,
  }
}

/** The JobEnqueued schema, read from its file: every value is written with it. */
export function jobEnqueuedType(schemasDir) {
  return avro.Type.forSchema(JSON.parse(readFileSync(join(schemasDir, 'JobEnqueued.avsc'), 'utf8')))
}

export function encode(type, event) {
  return Buffer.concat([singleObjectHeader(type), type.toBuffer(event)])
}

const LEVEL_NAMES = Object.fromEntries(Object.entries(logLevel).map(([name, n]) => [n, name]))
const stderrLogs = () => ({ namespace, level, log }) =>
  process.stderr.write(`${JSON.stringify({ ...log, level: LEVEL_NAMES[level] ?? level, namespace })}\n`)

async function send(options, topic, key, value) {
  const kafka = new Kafka({
    clientId: 'evsched-interop-node',
    brokers: options.bootstrap.split(','),
    logLevel: logLevel.WARN,
    logCreator: stderrLogs,
  })
  // DefaultPartitioner is kafkajs's Java-compatible murmur2 one; named here so that no other
  // default can creep in. Idempotence + acks=all, so a retried send never makes two records.
  const producer = kafka.producer({
    createPartitioner: Partitioners.DefaultPartitioner,
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false,
  })
  await producer.connect()
  try {
    const [landed] = await producer.send({ topic, acks: -1, messages: [{ key, value }] })
    return landed
  } finally {
    await producer.disconnect()
  }
}

async function main() {
  const options = readOptions(process.argv.slice(2), process.env)
  if (options.help) {
    process.stdout.write(`${USAGE}\n`)
    return 0
  }
  const type = jobEnqueuedType(options.schemas)
  const event = buildEnqueue(options, integer(options['emitted-at'], '--emitted-at', 0) ?? Date.now())
  const value = encode(type, event)
  const topic = `${options.namespace}.events`
  if (options['dry-run']) {
    process.stdout.write(`${JSON.stringify({ job_id: event.job_id, topic, key: event.job_id, value: value.toString('hex') })}\n`)
    return 0
  }
  const landed = await send(options, topic, event.job_id, value)
  process.stderr.write(
    `${JSON.stringify({ job_id: event.job_id, event_id: event.event_id, topic, partition: landed.partition, offset: Number(landed.baseOffset) })}\n`,
  )
  process.stdout.write(`${event.job_id}\n`)
  return 0
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  // exitCode rather than exit(): output to a pipe is flushed before the process ends.
  main().then(
    (code) => {
      process.exitCode = code
    },
    (error) => {
      process.stderr.write(`enqueue.mjs: ${error.message}\n`)
      if (error instanceof UsageError) process.stderr.write(`${USAGE}\n`)
      process.exitCode = error instanceof UsageError ? 2 : 1
    },
  )
}
