/* cmd_run.c: `dsflash run`: one prompt in, the streamed answer out. The options, model
 * loading, prompt rendering and printer it shares with `dsflash chat` are in frontend.c.
 * Owns only argument handling and terminal I/O; generation is src/runtime/generate.c. */
#include "cmd.h"
#include "frontend.h"
#include "dsflash.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ==== dsflash run ====================================================================== */

static const char *RUN_USAGE =
    "usage: dsflash run -m MODEL.gguf -p PROMPT [options]\n\n"
    "Renders PROMPT as one user turn with the V4.1 chat encoder, generates and streams the\n"
    "answer to stdout: the reasoning first (dim on a terminal, else prefixed \"[thinking] \" and\n"
    "followed by a blank line), then the answer; tool calls as JSON lines. A stats line goes to\n"
    "stderr.\n\n"
    "  -p, --prompt TEXT  the user message                                            [required]\n"
    "  --raw              no chat template: tokenize TEXT as-is (special tokens parsed), with BOS\n"
    "With --mmproj PROJ --image FILE the image goes before TEXT in the user message.\n";

static int cmd_run(int argc, char **argv) {
    if (dsf_cmd_wants_help(argc, argv)) {
        printf("%s%s%s%s%s%s", RUN_USAGE, GEN_CLI_OPTIONS_HELP, GEN_CLI_IMAGE_HELP, GEN_CLI_ENGRAM_HELP, GEN_CLI_UBATCH_HELP,
               GEN_CLI_DRAFT_HELP);
        return 0;
    }
    gen_cli_opts o;
    gen_cli_defaults(&o, "run");
    const char *prompt = NULL;
    bool raw = false;
    for (int i = 1; i < argc; i++) {
        int r = gen_cli_option(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(argv[i], "-p") || !strcmp(argv[i], "--prompt")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dsflash run: option %s needs a value\n", argv[i]);
                return 2;
            }
            prompt = argv[++i];
        } else if (!strcmp(argv[i], "--raw")) {
            raw = true;
        } else {
            fprintf(stderr, "dsflash run: unknown option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    if (!o.model) {
        fprintf(stderr, "dsflash run: no model (-m MODEL.gguf)\n");
        return 2;
    }
    if (!prompt) {
        fprintf(stderr, "dsflash run: no prompt (-p TEXT)\n");
        return 2;
    }
    if (raw && o.n_images) {
        fprintf(stderr, "dsflash run: --image needs the chat template (not --raw)\n");
        return 2;
    }
    if (!o.seed_set) o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

    gen_cli_model m;
    if (gen_cli_load(&o, &m)) return 1;
    char err[DSF_ERR_LEN] = "";
    int32_t *ids = NULL;
    int n = 0, rc = 1;
    bool gen_reasoning = false;
    if (raw) {
        size_t nv = 0;
        bool bos = dsf_tokenizer_bos(m.tok) >= 0;
        if (dsf_tokenize(m.tok, prompt, strlen(prompt), bos, true, &ids, &nv, err)) goto done;
        if (nv == 0 || nv > (size_t)1 << 30) {
            dsf_seterr(err, "the prompt gives %zu tokens", nv);
            goto done;
        }
        n = (int)nv;
    } else {
        json_t *msgs = json_array();
        if (o.system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o.system));
        json_t *user = gen_cli_user_message(&m, prompt, strlen(prompt), true);
        if (user) json_array_append_new(msgs, user);
        char *mj = user ? json_dumps(msgs, JSON_COMPACT) : NULL;
        json_decref(msgs);
        if (!mj) {
            dsf_seterr(err, "the prompt is not valid UTF-8");
            goto done;
        }
        int prc = gen_cli_prompt(&o, m.tok, mj, &ids, &n, &gen_reasoning, err);
        free(mj);
        if (prc) goto done;
    }

    gen_cli_printer pr;
    gen_cli_printer_init(&pr, stdout);
    dsf_gen_params gp;
    dsf_gen_params_default(&gp);
    gp.sampler = o.sp;
    gp.parse_dsml = !raw;
    gp.dsml_thinking = gen_reasoning;
    gp.on_dsml = gen_cli_on_dsml;
    gp.on_text = raw ? gen_cli_on_text : NULL;
    gp.ud = &pr;
    dsf_gen_result res;
    int grc = gen_cli_generate(&m, ids, n, &gp, NULL, &res, err);
    gen_cli_printer_end(&pr, res.has_dsml ? &res.dsml : NULL);
    gen_cli_printer_free(&pr);
    if (grc == 0) {
        gen_cli_print_stats("run", &res);
        gen_cli_print_spec("run", &m);
        rc = 0;
    }
    dsf_gen_result_free(&res);
done:
    if (rc) fprintf(stderr, "dsflash run: %s\n", err);
    free(ids);
    gen_cli_unload(&m);
    return rc;
}

DSF_COMMAND(run, "generate a reply to one prompt (streams to stdout)", cmd_run)
