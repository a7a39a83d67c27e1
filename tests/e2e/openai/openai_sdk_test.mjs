// The official OpenAI SDK (npm `openai`, pinned in package.json) drives kiln-server's HTTP API:
// model listing, chat and completions (whole and streamed), n > 1, stop strings, usage, errors
// as the SDK's typed errors, and greedy output equal to gRPC Generate (through the kiln CLI).
//
//   node openai_sdk_test.mjs --server build/dev/server/kiln-server --kiln build/dev/clients/kiln
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import OpenAI from 'openai';

function flag(name) {
  const at = process.argv.indexOf(`--${name}`);
  if (at < 0 || at + 1 >= process.argv.length) throw new Error(`missing --${name}`);
  return process.argv[at + 1];
}
const serverBinary = flag('server');
const kilnBinary = flag('kiln');
const API_KEY = 'e2e-key';

// Starts kiln-server on free ports and resolves with its gRPC and HTTP addresses once it prints
// its ready line.
function startServer(root, extraArgs) {
  const child = spawn(serverBinary, [
    '--model-root', root, '--model', `tiny=${join(root, 'tiny')}`, '--listen', '127.0.0.1:0',
    '--http-listen', '127.0.0.1:0', '--api-key', API_KEY, '--max-context', '1024', ...extraArgs,
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stderr.on('data', (data) => { log += data; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ready line; log:\n${log}`)), 60000);
    child.on('exit', (code) => reject(new Error(`kiln-server exited with ${code}:\n${log}`)));
    createInterface({ input: child.stdout }).on('line', (line) => {
      const grpc = line.match(/ready on (\S+) /);
      const http = line.match(/OpenAI API on (http:\/\/\S+\/v1)/);
      if (grpc && http) {
        clearTimeout(timer);
        resolve({ child, grpc: grpc[1], baseURL: http[1] });
      }
    });
  });
}

const tests = [];
const test = (name, body) => tests.push({ name, body });

let server;
let client;
const greedy = { temperature: 0, ignore_eos: true };

test('models.list names the READY model', async () => {
  const models = [];
  for await (const model of client.models.list()) models.push(model);
  assert.deepEqual(models.map((m) => m.id), ['tiny']);
  assert.equal(models[0].object, 'model');
  assert.equal((await client.models.retrieve('tiny')).id, 'tiny');
});

test('chat: whole and streamed responses agree, with usage', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello' }];
  const whole = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, ...greedy });
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices[0].message.role, 'assistant');
  assert.equal(whole.choices[0].finish_reason, 'length');
  assert.equal(whole.usage.completion_tokens, 10);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + 10);

  const stream = await client.chat.completions.create({
    model: 'tiny', messages, max_tokens: 10, stream: true, stream_options: { include_usage: true }, ...greedy,
  });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.ok(chunks >= 3);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('completions: greedy output equals gRPC Generate for the same prompt ids', async () => {
  const ids = [72, 101, 108, 108, 111, 44, 32];
  const http = await client.completions.create({ model: 'tiny', prompt: ids, max_tokens: 16, ...greedy });
  const grpc = execFileSync(kilnBinary, [
    'generate', '--server', server.grpc, '--model', 'tiny', '--prompt_ids', ids.join(','),
    '--max_tokens', '16', '--ignore_eos',
  ], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  assert.equal(http.choices[0].text, grpc.replace(/\n$/, ''));
  assert.equal(http.usage.completion_tokens, 16);
  assert.equal(http.usage.prompt_tokens, ids.length);
});

test('completions: streamed, several prompts and n > 1', async () => {
  const whole = await client.completions.create({
    model: 'tiny', prompt: ['One', 'Two'], n: 2, max_tokens: 5, temperature: 0.8, seed: 11, ignore_eos: true,
  });
  assert.equal(whole.object, 'text_completion');
  assert.deepEqual(whole.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.equal(whole.usage.completion_tokens, 20);
  const stream = await client.completions.create({
    model: 'tiny', prompt: ['One', 'Two'], n: 2, max_tokens: 5, temperature: 0.8, seed: 11, ignore_eos: true,
    stream: true,
  });
  const texts = ['', '', '', ''];
  for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.text;
  assert.deepEqual(texts, whole.choices.map((c) => c.text));
});

test('stop strings end the text before them', async () => {
  const free = await client.completions.create({ model: 'tiny', prompt: 'The', max_tokens: 24, ...greedy });
  const text = free.choices[0].text;
  assert.ok(text.length >= 6, text);
  const stop = text.slice(3, 5);
  const stopped = await client.completions.create({ model: 'tiny', prompt: 'The', max_tokens: 24, stop: [stop], ...greedy });
  assert.equal(stopped.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(stopped.choices[0].finish_reason, 'stop');
});

test('errors surface as the SDK\'s typed errors', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /nope/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], temperature: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
  const wrongKey = new OpenAI({ baseURL: server.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

test('a full queue is a RateLimitError', async () => {
  const root = process.env.KILN_E2E_ROOT;
  const full = await startServer(root, ['--max-queued', '0']);
  try {
    const fullClient = new OpenAI({ baseURL: full.baseURL, apiKey: API_KEY, maxRetries: 0 });
    await assert.rejects(
      fullClient.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 2 }),
      (e) => e instanceof OpenAI.RateLimitError && e.status === 429);
  } finally {
    full.child.kill('SIGTERM');
  }
});

const root = mkdtempSync(join(tmpdir(), 'kiln-openai-e2e-'));
process.env.KILN_E2E_ROOT = root;
let failures = 0;
try {
  execFileSync(kilnBinary, ['synth', '--out', join(root, 'tiny')], { stdio: 'ignore' });
  server = await startServer(root, []);
  client = new OpenAI({ baseURL: server.baseURL, apiKey: API_KEY, maxRetries: 0, timeout: 60000 });
  for (const { name, body } of tests) {
    try {
      await body();
      console.log(`ok   ${name}`);
    } catch (error) {
      failures++;
      console.log(`FAIL ${name}\n${error.stack ?? error}`);
    }
  }
} finally {
  if (server) server.child.kill('SIGTERM');
  rmSync(root, { recursive: true, force: true });
}
console.log(failures === 0 ? `all ${tests.length} passed` : `${failures} of ${tests.length} failed`);
process.exit(failures === 0 ? 0 : 1);
