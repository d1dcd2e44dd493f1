// omni-logprobs: the quality probe (omni_ray/workload/quality.py) on a GGUF, with llama.cpp.
//
// What: loads a GGUF with llama.h, reads exact token ids from a file (no tokenizer: the probe's
// ids come from probe_ids), evaluates them teacher-forced in one batch with logits at every
// position, and writes the log-probability of each id i+1 after ids[0..i] (log-softmax of the
// float32 logits, in double); then generates --tokens ids greedily (argmax, lowest id on a tie,
// no EOS stop) after the whole sequence. One JSON object on stdout:
//     {"n_vocab": V, "logprobs": [...n-1...], "greedy_ids": [...tokens...]}
// Why: llama-bench gives no log-probabilities, and llama-perplexity scores a text through the
// GGUF's tokenizer, not these ids; vLLM and transformers arms read the same ids the same way.
// Built by omni_ray.peers.llamacpp (_build_logprobs_tool) against the static libraries of the
// llama.cpp build omni-ray makes, with llama-bench's compile flags and link line.
//
// Usage: omni-logprobs -m MODEL.gguf --ids IDS_FILE --tokens N [-t THREADS] [-fa on|off|auto]
// IDS_FILE holds the ids as decimal integers separated by whitespace or commas.

#include "llama.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void die(const char * what) {
    fprintf(stderr, "omni-logprobs: error: %s\n", what);
    exit(2);
}

static std::vector<llama_token> read_ids(const char * path) {
    FILE * f = fopen(path, "r");
    if (!f) {
        die((std::string("cannot open ids file ") + path + ": " + strerror(errno)).c_str());
    }
    std::vector<llama_token> ids;
    std::string tok;
    int c;
    auto flush = [&]() {
        if (tok.empty()) {
            return;
        }
        char * end = nullptr;
        long v = strtol(tok.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > INT32_MAX) {
            die(("not a token id: '" + tok + "'").c_str());
        }
        ids.push_back((llama_token) v);
        tok.clear();
    };
    while ((c = fgetc(f)) != EOF) {
        if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']') {
            flush();
        } else {
            tok.push_back((char) c);
        }
    }
    flush();
    fclose(f);
    return ids;
}

static llama_token argmax(const float * logits, int n_vocab) {
    int best = 0;
    for (int j = 1; j < n_vocab; ++j) {
        if (logits[j] > logits[best]) {
            best = j;
        }
    }
    return best;
}

// log p(id) = l[id] - max - log(sum_j exp(l[j] - max)), summed in double
static double log_softmax_at(const float * logits, int n_vocab, llama_token id) {
    double mx = logits[0];
    for (int j = 1; j < n_vocab; ++j) {
        mx = logits[j] > mx ? logits[j] : mx;
    }
    double sum = 0.0;
    for (int j = 0; j < n_vocab; ++j) {
        sum += std::exp((double) logits[j] - mx);
    }
    return (double) logits[id] - mx - std::log(sum);
}

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    const char * model_path = nullptr;
    const char * ids_path = nullptr;
    long tokens = -1;
    int threads = 1;
    enum llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_AUTO;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (i + 1 >= argc) {
            die(("missing value after " + a).c_str());
        }
        const char * v = argv[++i];
        if (a == "-m") {
            model_path = v;
        } else if (a == "--ids") {
            ids_path = v;
        } else if (a == "--tokens") {
            tokens = strtol(v, nullptr, 10);
        } else if (a == "-t") {
            threads = (int) strtol(v, nullptr, 10);
        } else if (a == "-fa") {
            std::string s = v;
            fa = s == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED
               : s == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
               : s == "auto" ? LLAMA_FLASH_ATTN_TYPE_AUTO
               : (die(("-fa must be on, off or auto, got " + s).c_str()), fa);
        } else {
            die(("unknown argument " + a).c_str());
        }
    }
    if (!model_path || !ids_path || tokens < 1 || threads < 1) {
        die("usage: omni-logprobs -m MODEL.gguf --ids IDS_FILE --tokens N>=1 [-t N>=1] "
            "[-fa on|off|auto]");
    }
    std::vector<llama_token> ids = read_ids(ids_path);
    const int n = (int) ids.size();
    if (n < 2) {
        die("the ids file holds fewer than 2 ids");
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.load_mode = LLAMA_LOAD_MODE_NONE;  // anonymous memory, as the arm's llama-bench (-lm none)
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        die((std::string("cannot load ") + model_path).c_str());
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (llama_token t : ids) {
        if (t >= n_vocab) {
            die(("token id " + std::to_string(t) + " is outside the model's vocabulary of " +
                 std::to_string(n_vocab)).c_str());
        }
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (n + tokens);
    cp.n_batch = (uint32_t) n;  // the whole sequence in one llama_decode, logits at every position
    cp.n_ubatch = (uint32_t) (n < 512 ? n : 512);
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = fa;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create a llama.cpp context");
    }

    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        die("llama_decode failed on the sequence");
    }
    std::vector<double> logprobs(n - 1);
    for (int i = 0; i + 1 < n; ++i) {
        logprobs[i] = log_softmax_at(llama_get_logits_ith(ctx, i), n_vocab, ids[i + 1]);
        if (!std::isfinite(logprobs[i])) {
            die(("log-probability at position " + std::to_string(i) + " is not finite").c_str());
        }
    }

    std::vector<llama_token> greedy;
    llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
    for (long k = 0; k < tokens; ++k) {
        greedy.push_back(next);
        if (k + 1 == tokens) {
            break;
        }
        batch.n_tokens = 1;
        batch.token[0] = next;
        batch.pos[0] = n + (int) k;
        batch.logits[0] = 1;
        if (llama_decode(ctx, batch) != 0) {
            die("llama_decode failed while generating");
        }
        next = argmax(llama_get_logits_ith(ctx, 0), n_vocab);
    }

    printf("{\"n_vocab\": %d, \"logprobs\": [", n_vocab);
    for (int i = 0; i + 1 < n; ++i) {
        printf("%s%.10g", i ? ", " : "", logprobs[i]);
    }
    printf("], \"greedy_ids\": [");
    for (size_t k = 0; k < greedy.size(); ++k) {
        printf("%s%d", k ? ", " : "", greedy[k]);
    }
    printf("]}\n");

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
