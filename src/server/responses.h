/* responses.h: the OpenAI Responses API's JSON for `dsflash serve` (responses.c), pure: no
 * sockets, no engine, no store. server_resp.c is the endpoint that uses it; the unit tests
 * check it without a model.
 *
 * A Responses request maps onto one chat-completions request (the shared internal request:
 * its prompt is rendered and its output parsed exactly as /v1/chat/completions does):
 *   input items      -> messages (instructions first, as a system message);
 *   function tools   -> tools; tool_choice, parallel_tool_calls, reasoning.effort,
 *   max_output_tokens, temperature, top_p, text.format -> the chat keys of the same meaning.
 * The output comes back as items: a reasoning item, a message item, function_call items. */
#ifndef DSF_SERVER_RESPONSES_H
#define DSF_SERVER_RESPONSES_H

#include "server/server.h"

/* A mapped request. */
typedef struct {
    json_t *chat; /* the chat-completions request (messages, tools, tool_choice, ...) */
    json_t *echo; /* the request fields a Response object repeats (tools, tool_choice, text, ...) */
    json_t *conv; /* the conversation: the history's items, then this input's (normalized) */
    bool store;   /* "store" (default true) */
} resp_request;

/* Maps a Responses request body onto a chat request. history: the input + output items of
 * the previous_response_id chain (NULL: none). 400s naming the field in e. */
int resp_map_request(const json_t *body, const json_t *history, resp_request *out, srv_error *e);
void resp_request_free(resp_request *r);

/* Appends the chat messages of a list of Responses input items to messages (an assistant
 * turn gathers a reasoning item, a message and the function calls that follow it). param:
 * the list's name in error messages ("input"). */
int resp_items_to_messages(const json_t *items, const char *param, json_t *messages, srv_error *e);

typedef struct {
    int input, cached, output, reasoning;
} resp_usage;

json_t *resp_usage_json(const resp_usage *u);

/* Output items (status "completed", "in_progress" or "incomplete"). */
json_t *resp_item_reasoning(const char *id, const char *text, size_t len, const char *status);
json_t *resp_item_message(const char *id, const char *text, size_t len, const char *status);
json_t *resp_item_call(const char *id, const char *call_id, const char *name, const char *ns, const char *args,
                       size_t args_len, const char *status);
/* The ids of a response's items, from the random part of its id ("resp_<rid>"):
 * rs_<rid>, msg_<rid>, fc_<rid>_<index>. */
void resp_item_id(char out[64], const char *kind, const char *rid, int index);

/* The output items of a finished generation: reasoning (when any), the message (when it has
 * text), then the calls (only the first when parallel is false) with call ids ids[i].
 * last_status: of the last item (the one a length limit cuts off); the others "completed". */
json_t *resp_output(const dsf_dsml_result *r, const char *rid, char ids[][32], bool parallel, const char *last_status);

/* The Response object: meta's id, created_at and model, echo's fields, status, output
 * (stolen; NULL: []), usage (NULL: null), incomplete_details {reason} when incomplete is not
 * NULL, error {code "server_error", message} when error is not NULL. */
json_t *resp_object(const srv_meta *m, const json_t *echo, const char *status, json_t *output, const resp_usage *u,
                    const char *incomplete, const char *error);

/* Appends one stream event: sets ev's sequence_number to (*seq)++, then writes
 * "event: <type>\ndata: <json>\n\n". Steals ev. */
void resp_event(dsf_buf *b, json_t *ev, int *seq);

/* ==== the stream: DSML events -> Responses events =========================================
 * One item is open at a time: a reasoning item (content part reasoning_text), a message
 * (content part output_text) or a function call; a new kind of text or a new call closes it
 * (its .done events and response.output_item.done) and opens the next
 * (response.output_item.added, the content part). Every event carries sequence_number 0, 1,
 * ...; item events carry item_id and output_index (and content_index 0). */
typedef struct {
    char rid[48];           /* the random part of the response id */
    bool parallel;          /* false: calls after the first are dropped */
    int seq;                /* the next sequence_number */
    json_t *items;          /* output items done, in order */
    int open;               /* 0 none, 1 reasoning, 2 message, 3 function call */
    int open_call;          /* the open call's DSML index */
    char open_id[64];       /* the open item's id */
    char open_call_id[32];  /* the open call's call_id */
    char *open_name, *open_ns;
    dsf_buf text;           /* the open item's text or arguments so far */
    /* reasoning tokens: counted while the output is inside the reasoning */
    bool in_reasoning;
    char tail[32];          /* the output's last bytes, to see the reasoning end */
    size_t tail_len;
    int reasoning_tokens;
} resp_stream;

/* reasoning: the generation starts inside the reasoning (dsf_chat_prompt.gen_reasoning). */
void resp_stream_init(resp_stream *rs, const char *rid, bool parallel, bool reasoning);
void resp_stream_free(resp_stream *rs);
/* response.created and response.in_progress carrying r (an in_progress Response; stolen). */
void resp_stream_begin(resp_stream *rs, json_t *r, dsf_buf *out);
/* One DSML event of the generation; call_id: the id of call ev->index (tool events). */
void resp_stream_dsml(resp_stream *rs, const dsf_dsml_event *ev, const char *call_id, dsf_buf *out);
/* Closes the open item with status (completed / incomplete). Returns the items done (borrowed). */
const json_t *resp_stream_close(resp_stream *rs, const char *status, dsf_buf *out);
/* The last event, response.<r's status> carrying r (the final Response; stolen). */
void resp_stream_end(resp_stream *rs, json_t *r, dsf_buf *out);
/* Counts one sampled token (its text piece) toward reasoning_tokens while the output is inside
 * the reasoning: up to and including the one that completes "</think>" or starts a tool call. */
void resp_stream_token(resp_stream *rs, const char *piece, size_t len);

#endif
