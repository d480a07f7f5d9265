// What `tsc -p clients/node` (run by `cargo xtask lint`) holds the library to: src/index.js
// exports what index.d.ts declares, no more and no less. The sources are typed in JSDoc with
// the types of index.d.ts and checked strictly (tsconfig.json), and Lease implements the
// declared Lease, so a declaration the code does not keep is a compile error. Never run.

import * as implementation from "./src/index.js";

/** @typedef {typeof import("./index.js")} Declared */

/**
 * Every declared export, from the implementation. Lease's constructor is left out: index.d.ts
 * keeps it private (leases come from `Lease.connect()`, and the constructor refuses others).
 * @type {Omit<Declared, "Lease"> & { Lease: Pick<Declared["Lease"], keyof Declared["Lease"]> }}
 */
export const declared = implementation;

/** @type {Record<Exclude<keyof typeof implementation, keyof Declared>, never>} */
export const undeclared = {};
