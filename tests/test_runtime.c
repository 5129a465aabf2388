#define _POSIX_C_SOURCE 200809L
/* test_runtime.c — the runtime's contract where no GPU is needed: status
 * codes and messages, argument checks, spec errors before any driver use,
 * and, on a machine without a driver or GPU, the clear status instead of a
 * failure to start. (The GPU half is test_gpu.) */
#include "check.h"
#include "driver.h"
#include "moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    CASE("status strings");
    for (int s = MOE_OK; s <= MOE_ERR_UNSUPPORTED; s++)
        CHECKF(strcmp(moe_status_string((moe_status)s), "unknown status") != 0, "status %d has no string", s);
    CHECK_STREQ(moe_status_string(MOE_ERR_NO_DRIVER), "no CUDA driver");
    CHECK_STREQ(moe_status_string(MOE_ERR_NO_GPU), "no GPU");
    CHECK(MOE_OK == 0);

    CASE("NULL arguments");
    moe_plan *plan = (moe_plan *)1;
    CHECK(moe_plan_create(NULL, "x.moe", NULL) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_create(&plan, NULL, NULL) == MOE_ERR_INVALID_ARG && plan == NULL);
    CHECK(moe_forward(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG);
    CHECK(strstr(moe_last_error(), "NULL") != NULL);
    CHECK(moe_plan_workspace_size(NULL, 1) == 0);
    moe_plan_destroy(NULL);

    CASE("spec errors come before the driver");
    CHECK(moe_plan_create(&plan, "tests/specs/bad/top_k_gt_experts.moe", NULL) == MOE_ERR_SPEC && plan == NULL);
    CHECKF(strstr(moe_last_error(), "tests/specs/bad/top_k_gt_experts.moe:") == moe_last_error(),
           "message: %s", moe_last_error());
    CHECK(moe_plan_create(&plan, "no/such/file.moe", NULL) == MOE_ERR_SPEC);
    CHECK(strstr(moe_last_error(), "cannot open") != NULL);

    CASE("a mesh larger than one device needs the communicator, checked before the driver");
    moe_status st = moe_plan_create(&plan, "tests/specs/mesh_ep2.moe", NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && plan == NULL, "got %s", moe_status_string(st));
    CHECKF(strstr(moe_last_error(), "2 devices") && strstr(moe_last_error(), "nccl_comm"), "message: %s",
           moe_last_error());
    CASE("a rank outside the mesh is refused");
    moe_options bad_rank = {.rank = 2};
    st = moe_plan_create(&plan, "tests/specs/mesh_ep2.moe", &bad_rank);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "rank 2 is outside the mesh of 2"), "got %s: %s",
           moe_status_string(st), moe_last_error());

    CASE("from_dir errors");
    CHECK(moe_plan_create_from_dir(&plan, "no/such/dir", NULL) == MOE_ERR_IO);
    CHECK(strstr(moe_last_error(), "manifest.json") != NULL);

    CASE("no driver or no GPU");
    char why[256];
    if (moe_cu_load(why, sizeof why) != 0) {
        st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
        CHECKF(st == MOE_ERR_NO_DRIVER, "got %s", moe_status_string(st));
        CHECKF(strncmp(moe_last_error(), "no CUDA driver: ", 16) == 0, "message: %s", moe_last_error());
        CHECK(plan == NULL);
    } else {
        int n = 0;
        if (moe_cu.cuInit(0) != CUDA_SUCCESS || moe_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
            st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
            CHECKF(st == MOE_ERR_NO_GPU, "got %s", moe_status_string(st));
        } else {
            SKIP("this machine has a GPU: the no-driver status is checked where there is none");
        }
    }
    CASE("README's table of switches and the code's getenv calls name the same variables");
    {
        /* both lists, sorted and unique, as one line each */
        FILE *code = popen("grep -rhoE 'getenv\\(\"MOEGEN_[A-Z_]+' gen runtime tests bench examples "
                           "| sed 's/.*\"//' | sort -u | tr '\\n' ' '", "r");
        FILE *doc = popen("grep -oE '^\\| `MOEGEN_[A-Z_]+`' README.md | sed 's/[|` ]//g' | sort -u | tr '\\n' ' '",
                          "r");
        char a[1024] = "", b[1024] = "";
        if (code) {
            if (!fgets(a, sizeof a, code))
                a[0] = '\0';
            pclose(code);
        }
        if (doc) {
            if (!fgets(b, sizeof b, doc))
                b[0] = '\0';
            pclose(doc);
        }
        CHECKF(a[0] != '\0', "no getenv(\"MOEGEN_...\") found in the code");
        CHECK_STREQ(a, b);
    }
    return check_report("test_runtime");
}
