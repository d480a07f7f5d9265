// The daemon speaks snake_case (docs/PROTOCOL.md); JavaScript reads camelCase. Keys are
// converted, values (event kinds, reasons, states) are kept as the protocol spells them.

/** @param {string} key */
const camelKey = (key) =>
  key.replace(/_([a-z0-9])/g, (/** @type {string} */ _, /** @type {string} */ c) =>
    c.toUpperCase(),
  );

/**
 * A copy of a JSON value with every object key in camelCase.
 * @param {unknown} value
 * @returns {any} the shape index.d.ts gives the daemon's reply, in camelCase
 */
export function camelCase(value) {
  if (Array.isArray(value)) return value.map(camelCase);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [camelKey(k), camelCase(v)]));
}
