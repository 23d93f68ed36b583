"""Route kernels at run time: what a subserver calls after each forward step.

    kernel = RouteKernel(plan, model, backend="torch" | "triton" | "auto", device, embed=callable | None)
        renders the model's route IR (plan["routes"][model]) with jinja2 at construction — a plan never
        carries code — and loads the routers the block reads (safetensors only, shape-checked; a file that
        does not fit raises RouterFileError naming it).
    result = kernel(logits [B, V] fp32/bf16, hidden [B, H] | None, state: RouteBatchState)
        RouteBatchState ([B] tensors on the device): seed int64, position int64 (index of the token being
        sampled), temperature f32 (0 = greedy), top_k int32 (0 = off), top_p f32 (1 = off), run_length and
        generated int64 (committed BEFORE this token; the kernel adds 1, docs/ir.md).
        RouteResult: token int64 [B], logprob f32 [B], rule int32 [B] (fired rule index, -1 = stay), and
        with `with_features=True` the feature values (and router outputs) by name.
    kernel.needs_hidden -> bool;  kernel.source -> str (the rendered code, `tokenrouter inspect --kernels`)

`embed(token_ids [B]) -> [B, H]` comes from the engine, for routers that read `embedding(MODEL, token)`.
"""

from tokenrouter.runtime.route.kernel import RouteBatchState, RouteKernel, RouteKernelError, RouteResult
from tokenrouter.runtime.route.routers import RouterFileError

__all__ = ["RouteBatchState", "RouteKernel", "RouteKernelError", "RouteResult", "RouterFileError"]
