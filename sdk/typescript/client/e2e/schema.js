// A walker over the OpenAPI document's schemas: it holds an answer to its schema field by field
// (present when required, the right JSON type, format, enum and pattern; nothing undeclared) and
// records which fields it saw, so the run can show that every field of every schema it reached
// was read at least once.

/** Walker walks values against the schemas of one OpenAPI document (as JSON). */
export class Walker {
  constructor(doc) {
    this.schemas = doc.components.schemas;
    /** field ("Execution.attempts[].failure.reason" style keys: Schema.field) → times seen present */
    this.seen = new Map();
    /** every field of every schema reached */
    this.defined = new Set();
    this.checks = 0;
    this.problems = [];
  }

  /** walk holds value to the named schema; where names the answer in messages. */
  walk(name, value, where) {
    this.#walk({ $ref: `#/components/schemas/${name}` }, value, where, name);
  }

  #resolve(schema) {
    let owner;
    while (schema.$ref) {
      owner = schema.$ref.split('/').pop();
      schema = this.schemas[owner];
      if (!schema) throw new Error(`no schema ${owner}`);
    }
    return { schema, owner };
  }

  #problem(where, text) {
    this.problems.push(`${where}: ${text}`);
  }

  #walk(ref, value, where, key) {
    const { schema, owner } = this.#resolve(ref);
    const field = owner ?? key; // a named schema's fields are its own; an inline one's are its parent field's
    const types = schema.type === undefined ? [] : [].concat(schema.type);
    if (value === null) {
      if (!types.includes('null')) this.#problem(where, 'is null');
      return;
    }
    const type = types.find((t) => t !== 'null') ?? (schema.properties ? 'object' : undefined);
    switch (type) {
      case 'object': {
        if (typeof value !== 'object' || Array.isArray(value)) return this.#problem(where, `is ${kind(value)}, not an object`);
        const props = schema.properties ?? {};
        const required = new Set(schema.required ?? []);
        for (const [prop, sub] of Object.entries(props)) {
          const id = `${field}.${prop}`;
          this.defined.add(id);
          this.checks++;
          if (!(prop in value)) {
            if (required.has(prop)) this.#problem(`${where}.${prop}`, `required by ${field} and missing`);
            continue;
          }
          this.seen.set(id, (this.seen.get(id) ?? 0) + 1);
          this.#walk(sub, value[prop], `${where}.${prop}`, id);
        }
        if (schema.additionalProperties !== true) {
          for (const prop of Object.keys(value)) {
            if (!(prop in props)) this.#problem(`${where}.${prop}`, `is sent but ${field} does not declare it`);
          }
        }
        return;
      }
      case 'array':
        if (!Array.isArray(value)) return this.#problem(where, `is ${kind(value)}, not an array`);
        value.forEach((v, i) => this.#walk(schema.items ?? {}, v, `${where}[${i}]`, `${field}[]`));
        return;
      case 'integer':
        if (!Number.isInteger(value)) this.#problem(where, `is ${kind(value)}, not an integer`);
        break;
      case 'number':
        if (typeof value !== 'number') this.#problem(where, `is ${kind(value)}, not a number`);
        break;
      case 'boolean':
        if (typeof value !== 'boolean') this.#problem(where, `is ${kind(value)}, not a boolean`);
        break;
      case 'string':
        if (typeof value !== 'string') return this.#problem(where, `is ${kind(value)}, not a string`);
        if (schema.format === 'date-time' && !rfc3339.test(value)) this.#problem(where, `${JSON.stringify(value)} is not an RFC 3339 time`);
        if (schema.format === 'int64' && !/^-?\d+$/.test(value)) this.#problem(where, `${JSON.stringify(value)} is not an int64 as a string`);
        if (schema.format === 'uuid' && !uuid.test(value)) this.#problem(where, `${JSON.stringify(value)} is not a UUID`);
        if (schema.pattern && !new RegExp(schema.pattern, 'u').test(value)) this.#problem(where, `${JSON.stringify(value)} does not match ${schema.pattern}`);
        break;
      case undefined:
        break;
      default:
        this.#problem(where, `schema type ${type} is not known to the walker`);
    }
    if (schema.enum && !schema.enum.includes(value)) this.#problem(where, `${JSON.stringify(value)} is not one of ${schema.enum.join(', ')}`);
    if ('const' in schema && value !== schema.const) this.#problem(where, `${JSON.stringify(value)} is not ${JSON.stringify(schema.const)}`);
  }

  /** unseen: the fields of the schemas reached that no answer carried. */
  unseen() {
    return [...this.defined].filter((f) => !this.seen.has(f)).sort();
  }
}

const rfc3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;
const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function kind(v) {
  return Array.isArray(v) ? 'an array' : v === null ? 'null' : `a ${typeof v} (${JSON.stringify(v)?.slice(0, 40)})`;
}
