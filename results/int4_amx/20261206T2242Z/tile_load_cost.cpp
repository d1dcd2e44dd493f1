#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
struct alignas(64) Cfg { uint8_t p=1,s=0,r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={}; };
alignas(64) int8_t bufA[1<<20], bufB[1<<20]; alignas(64) int32_t C[4][256];
int main(){
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { puts("no amx"); return 1; }
  Cfg c; for(int t=0;t<8;++t){c.rows[t]=16;c.colsb[t]=64;}
  asm volatile("ldtilecfg %0"::"m"(c));
  memset(bufA,1,sizeof bufA); memset(bufB,1,sizeof bufB);
  const long N=2000000;
  _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
  _tile_loadd(4,bufA,64);_tile_loadd(5,bufA+1024,64);_tile_loadd(6,bufB,64);_tile_loadd(7,bufB+1024,64);
  auto t0=std::chrono::steady_clock::now();
  for(long i=0;i<N;++i){ _tile_dpbsud(0,4,6);_tile_dpbsud(1,4,7);_tile_dpbsud(2,5,6);_tile_dpbsud(3,5,7);}
  _tile_stored(0,C[0],64);
  auto t1=std::chrono::steady_clock::now();
  double ns=std::chrono::duration<double,std::nano>(t1-t0).count()/(4.0*N);
  printf("tdpbsud no loads: %.2f ns each = %.1f GMAC/s\n", ns, 16384/ns);
  // with loads from L1 (same 4 KB)
  t0=std::chrono::steady_clock::now();
  for(long i=0;i<N/4;++i){ _tile_loadd(4,bufA,64);_tile_loadd(5,bufA+1024,64);_tile_loadd(6,bufB,64);_tile_loadd(7,bufB+1024,64);
    _tile_dpbsud(0,4,6);_tile_dpbsud(1,4,7);_tile_dpbsud(2,5,6);_tile_dpbsud(3,5,7);}
  _tile_stored(0,C[0],64);
  t1=std::chrono::steady_clock::now();
  ns=std::chrono::duration<double,std::nano>(t1-t0).count()/(N);
  printf("with 4 L1 loads per 4: %.2f ns per tdp\n", ns);
  // loads from L2 (walk 1 MB)
  t0=std::chrono::steady_clock::now();
  for(long i=0;i<N/4;++i){ long o=(i*4096)&((1<<20)-1); _tile_loadd(4,bufA+o,64);_tile_loadd(5,bufA+o+1024,64);_tile_loadd(6,bufB+o,64);_tile_loadd(7,bufB+o+1024,64);
    _tile_dpbsud(0,4,6);_tile_dpbsud(1,4,7);_tile_dpbsud(2,5,6);_tile_dpbsud(3,5,7);}
  _tile_stored(0,C[0],64);
  t1=std::chrono::steady_clock::now();
  ns=std::chrono::duration<double,std::nano>(t1-t0).count()/(N);
  printf("with 4 L2 loads per 4: %.2f ns per tdp\n", ns);
  // store + zero cycle per 8 tdp (a unit)
  t0=std::chrono::steady_clock::now();
  for(long i=0;i<N/8;++i){ _tile_loadd(0,C[1],64);_tile_loadd(1,C[1],64);_tile_loadd(2,C[1],64);_tile_loadd(3,C[1],64);
    for(int k=0;k<2;++k){_tile_loadd(4,bufA+k*2048,64);_tile_loadd(5,bufA+1024+k*2048,64);_tile_loadd(6,bufB+k*2048,64);_tile_loadd(7,bufB+1024+k*2048,64);
    _tile_dpbsud(0,4,6);_tile_dpbsud(1,4,7);_tile_dpbsud(2,5,6);_tile_dpbsud(3,5,7);}
    _tile_stored(0,C[0],64);_tile_stored(1,C[0]+0,64);_tile_stored(2,C[2],64);_tile_stored(3,C[3],64);}
  t1=std::chrono::steady_clock::now();
  ns=std::chrono::duration<double,std::nano>(t1-t0).count()/(N);
  printf("unit (init 4, 2 chunks, store 4): %.2f ns per tdp\n", ns);
  _tile_release();
}
