// leash-client: spawn processes on a leash from Node.js and Bun. See README.md.

export { Lease } from "./lease.js";
export { claudeCodeSpawner } from "./claude.js";
export { LeashError } from "./errors.js";
export { DEFAULT_SOCKET } from "./locate.js";
export { PROTOCOL_VERSION } from "./connection.js";
