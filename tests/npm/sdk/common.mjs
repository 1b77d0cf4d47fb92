// common.mjs: what every SDK suite shares: the server under test (from tests/e2e/sdk.c's
// environment) and the official clients pointed at it.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

export const BASE = process.env.DSF_BASE_URL;
export const KEY = process.env.DSF_API_KEY;
export const MODEL = process.env.DSF_MODEL || 'tiny41.gguf';
if (!BASE || !KEY) throw new Error('DSF_BASE_URL and DSF_API_KEY must be set (tests/e2e/sdk.c sets them)');

// No retries: a failure must show, not be papered over.
export const openai = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120000 });
export const anthropic = new Anthropic({ baseURL: BASE, apiKey: KEY, maxRetries: 0, timeout: 120000 });
