import type { Client } from 'openapi-fetch';
import type { paths } from './generated/api.ts';

/** The raw typed openapi-fetch client over every path of the contract. */
export type MediagateApi = Client<paths>;
