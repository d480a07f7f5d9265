// The events iterator's bounded buffer, alone: a reader that falls behind loses events, and is
// told how many in their place, as the daemon tells a slow subscriber.

import assert from "node:assert/strict";
import { test } from "node:test";
import { EventReader } from "../src/events.js";

test("past maxBuffered, events are counted in a dropped event where they were lost", async () => {
  const reader = new EventReader(2);
  for (let n = 0; n < 6; n++) reader.push({ kind: "fork", n });
  const taken = [(await reader.next()).value, (await reader.next()).value];
  reader.push({ kind: "exit", n: 6 });
  taken.push((await reader.next()).value, (await reader.next()).value);
  assert.deepEqual(taken, [
    { kind: "fork", n: 0 },
    { kind: "fork", n: 1 },
    { kind: "dropped", tree: 0, lease: 0, count: 4 },
    { kind: "exit", n: 6 },
  ]);
});

test("a waiting reader gets the next event; an end with an error rejects it, then it is done", async () => {
  const reader = new EventReader();
  const waiting = reader.next();
  reader.push({ kind: "registered", tree: 1 });
  assert.deepEqual(await waiting, { value: { kind: "registered", tree: 1 }, done: false });
  const lost = reader.next();
  reader.end(new Error("lost"));
  await assert.rejects(lost, /lost/);
  assert.deepEqual(await reader.next(), { value: undefined, done: true });
  assert.throws(() => new EventReader(0), RangeError);
});

test("return() ends the iteration (for await ... break)", async () => {
  let returned = null;
  const reader = new EventReader(10, (r) => (returned = r));
  reader.push({ kind: "fork" });
  for await (const event of reader) {
    assert.equal(event.kind, "fork");
    break;
  }
  assert.equal(returned, reader);
  assert.deepEqual(await reader.next(), { value: undefined, done: true });
});
